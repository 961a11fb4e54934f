"""The exit codes of every `fsdp-planner` command, declared once.

The commands exit with these constants; `fsdp-planner --help` ends with `epilog()`, and docs/cli.md's
"Exit codes" section is `markdown_table()` (tests/api/test_cli_help.py holds both to this table). Print
the section's table with `python -m api.cli.exit_codes`.

Imports nothing beyond the standard library: the entry point reads it before any command is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ExitCode:
    code: int
    meaning: str
    """What happened, as a script checking `$?` needs to know it."""
    commands: str
    """Which commands exit with it, and when."""


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_UNAVAILABLE = 4
EXIT_OOM = 5
EXIT_INTERRUPTED = 130

EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(code=EXIT_OK, meaning="done", commands="every command"),
    ExitCode(
        code=EXIT_FAILED,
        meaning="failed",
        commands="the work itself failed and the reason is printed: the profiler (`calibrate`), the "
        "training run (`validate`), a job on the server failed or was cancelled or you stopped following "
        "it (`whatif --server`, `replan`, a large `plan` on a server), the database is not at the schema "
        "needed or a downgrade would lose data (`worker`, `db`), a key exists or is unknown (`keys`)",
    ),
    ExitCode(
        code=EXIT_INVALID_INPUT,
        meaning="invalid input",
        commands="every command: one line per problem, naming the option and the fix (an unknown or "
        "missing option, a value out of its range, an unreadable file, a model, GPU or cluster that "
        "cannot be read, a request the server refused as invalid); nothing was planned or started",
    ),
    ExitCode(
        code=EXIT_INFEASIBLE,
        meaning="infeasible",
        commands="no configuration fits in the GPUs' memory (`plan`, `replan`, `trace --server`, a plan "
        "job on a server); the message names a cluster and batch that plan",
    ),
    ExitCode(
        code=EXIT_UNAVAILABLE,
        meaning="unavailable",
        commands="the server at `--server` (or `FSDP_PLANNER_SERVER`) cannot be reached, answered a "
        "server error (5xx) or did not answer JSON: start it with `fsdp-planner serve`, or pass the "
        "right `--server`",
    ),
    ExitCode(
        code=EXIT_OOM,
        meaning="out of memory",
        commands="the plan ran out of GPU memory under `validate` (stored as an OOM run with `--upload`)",
    ),
    ExitCode(code=EXIT_INTERRUPTED, meaning="interrupted", commands="every command: stopped with Ctrl-C"),
)
"""Every exit code a command returns, in ascending order."""


def epilog() -> str:
    """The exit codes as the root `--help` ends: a line per code (Typer keeps lines apart when the
    paragraph starts with a backspace)."""
    lines = [f"{entry.code:>3}  {entry.meaning}: {entry.commands.replace('`', '')}" for entry in EXIT_CODES]
    return "\b\nExit codes:\n" + "\n".join(lines)


def markdown_table() -> str:
    """The exit codes as docs/cli.md's "Exit codes" section shows them."""
    rows = [f"| {entry.code} | {entry.meaning} | {entry.commands} |" for entry in EXIT_CODES]
    return "\n".join(["| code | meaning | when |", "| --- | --- | --- |", *rows])


if __name__ == "__main__":
    print(markdown_table())
