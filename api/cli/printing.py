"""The console the commands print their results on (stdout): as wide as the terminal, and whole when not a
terminal.

Rich lays a table out to the console's width, cutting its columns (`mean …`, `b…`) to fit, and a console
that is not a terminal (output piped to a file, to `less`, to `grep`) is 80 columns wide unless
`COLUMNS` says otherwise. A table written to a file is read whole, so there the console is as wide as
what it prints (`PIPED_WIDTH`): every table at its own width, every line unwrapped. `COLUMNS`, where
set, is the width asked for and is kept.
"""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 100_000
"""The width of stdout that is not a terminal: wider than any table or line a command prints, which then
takes its own width (a table is as wide as its cells, a line as long as its text)."""


def stdout_console() -> Console:
    """A Console on stdout: the terminal's width on a terminal; `PIPED_WIDTH` elsewhere, unless `COLUMNS`
    sets the width."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip():
        console.width = PIPED_WIDTH
    return console
