"""A command's tables piped to a file or a pager are whole: no column cut to 80 characters (`mean …`).

Each command prints on one console (api/cli/printing.py `stdout_console`): as wide as the terminal, as
wide as what it prints when stdout is not a terminal, `COLUMNS` kept where set. The installed console
script is run with its stdout a pipe, as `fsdp-planner fidelity > report.txt` or `| less` runs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "8192",
        "--global-batch-tokens", "131072"]


def piped(*args: str, columns: str | None = None) -> str:
    """What `fsdp-planner ARGS | cat` prints: stdout a pipe, no `COLUMNS` unless given."""
    executable = shutil.which("fsdp-planner", path=str(Path(sys.executable).parent)) or "fsdp-planner"
    env = {"PATH": str(Path(sys.executable).parent)} | ({"COLUMNS": columns} if columns else {})
    done = subprocess.run([executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_the_fidelity_tables_piped_are_whole() -> None:
    text = piped("fidelity", "--no-loso")
    assert "…" not in text, text
    header = re.compile(r"┃ GPU +┃ quantity +┃ fit runs ┃ mean \|err\| ┃ max \|err\| ┃ LOSO mean ┃ "
                        r"held-out runs ┃ mean \|err\| ┃ max \|err\| ┃ +bias ┃")
    assert header.search(text), text
    assert "│ H100-SXM-80GB │ throughput │" in text


def test_a_plan_piped_is_whole() -> None:
    text = piped(*PLAN)
    assert "…" not in text, text
    header = r"┃ configuration +┃ +tokens/s/GPU ┃ vs chosen ┃ +MFU ┃ +peak GiB ┃ exposed comm ┃"
    assert re.search(header, text), text


def test_columns_set_is_the_width_kept() -> None:
    text = piped(*PLAN, columns="80")
    assert max(len(line) for line in text.splitlines()) <= 80


def test_every_command_prints_on_the_one_stdout_console() -> None:
    """A command's stdout console is `stdout_console()`; a Console built elsewhere is stderr's, or prints
    prose that wraps softly (no table to cut)."""
    built = []
    for path in sorted((ROOT / "api" / "cli").glob("*.py")):
        if path.name == "printing.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for call in re.findall(r"\bConsole\([^)]*\)", line):
                if "stderr=True" not in call and "soft_wrap=True" not in call:
                    built.append(f"{path.relative_to(ROOT)}:{number}: {call}")
    assert not built, "\n".join(built)
