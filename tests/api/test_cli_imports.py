"""Each command imports what it uses (issue 42 item 1): the entry point nothing heavy, `plan` no web stack.

Every case runs in a fresh interpreter (a module imported by an earlier test would hide an import), resolves
one command the way `fsdp-planner COMMAND` does, and reports the top-level packages then in `sys.modules`.
The root's listing of lazily loaded commands must read exactly as the commands' own help.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from api.cli.commands import COMMANDS, CommandEntry, LazyCommand, PlannerGroup, load_command
from api.cli.main import app

WEB = {"fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "procrastinate", "prometheus_client"}
"""The service's stack: only serve, worker, db and keys need it."""
CLIENT = {"httpx"}
"""Only commands that talk to a server need it, and only when they do."""
TORCH = {"torch", "transformers", "tokenizers", "safetensors"}
"""The trainer's and profiler's stack: trace, calibrate and validate load it when they run."""

NOT_LOADED: dict[str, set[str]] = {
    "plan": WEB | CLIENT | TORCH,
    "replan": WEB | CLIENT | TORCH,
    "whatif": WEB | CLIENT | TORCH,
    "fidelity": WEB | CLIENT | TORCH,
    "launcher": WEB | CLIENT | TORCH,
    "prepare-data": WEB | CLIENT | TORCH,
    "trace": WEB | CLIENT | TORCH,
    "calibrate": WEB | CLIENT | TORCH,
    "validate": WEB | CLIENT | TORCH,
    "serve": TORCH,
    "worker": TORCH,
    "db": TORCH,
    "keys": TORCH,
}
"""What resolving each command (importing its module, building its options) must leave unloaded."""

RESOLVE = """
import json, sys
from api.cli.commands import COMMANDS, load_command
names = sys.argv[1:]
for entry in COMMANDS:
    if entry.name in names:
        load_command(entry)
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""

ROOT_HELP = """
import json, sys
from api.cli.main import app
try:
    app(["--help"], prog_name="fsdp-planner")
except SystemExit:
    pass
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def loaded_packages(*, code: str, args: list[str]) -> set[str]:
    """The top-level packages `code` has loaded: the last line it prints (after any help text)."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                          timeout=120)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_every_command_is_in_the_table() -> None:
    assert set(NOT_LOADED) == {entry.name for entry in COMMANDS}


def test_the_root_help_loads_no_command() -> None:
    loaded = loaded_packages(code=ROOT_HELP, args=[])
    assert not loaded & (WEB | CLIENT | TORCH | {"pydantic", "planner", "executor"}), loaded


@pytest.mark.parametrize("name", sorted(NOT_LOADED))
def test_a_command_imports_what_it_uses(name: str) -> None:
    loaded = loaded_packages(code=RESOLVE, args=[name])
    assert not loaded & NOT_LOADED[name], sorted(loaded & NOT_LOADED[name])


@pytest.mark.parametrize("entry", COMMANDS, ids=lambda entry: entry.name)
def test_the_listing_reads_as_the_commands_own_help(entry: CommandEntry) -> None:
    """Typer lists a command by the first paragraph of its help (rich_utils._make_command_help)."""
    command = load_command(entry)
    first_paragraph = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0].strip()
    assert first_paragraph == entry.summary


def test_the_root_help_is_the_same_as_with_every_command_loaded() -> None:
    """The lazy root's `--help` against an app with every module registered up front, as before."""
    eager = typer.Typer(name="fsdp-planner", cls=PlannerGroup, help=app.info.help, epilog=app.info.epilog,
                        no_args_is_help=True, add_completion=False)
    eager.callback()(lambda: None)
    for module in dict.fromkeys(entry.module for entry in COMMANDS):
        __import__(module, fromlist=["register"]).register(eager)
    runner = CliRunner()
    lazy_help = runner.invoke(app, ["--help"], prog_name="fsdp-planner", env={"COLUMNS": "120"})
    eager_help = runner.invoke(eager, ["--help"], prog_name="fsdp-planner", env={"COLUMNS": "120"})
    assert lazy_help.exit_code == eager_help.exit_code == 0
    assert lazy_help.output == eager_help.output


def test_a_resolved_command_runs_its_own_help_with_every_axis_option() -> None:
    from contract.mesh import searched_axes

    result = CliRunner().invoke(app, ["plan", "--help"], prog_name="fsdp-planner", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    options = [axis.option for axis in searched_axes() if axis.option]
    assert options
    for option in options:
        assert option in result.output


def test_a_mistyped_command_is_refused_with_a_suggestion() -> None:
    result = CliRunner().invoke(app, ["pln"], prog_name="fsdp-planner")
    assert result.exit_code == 2
    assert "'plan'" in result.output


def test_the_root_lists_commands_it_has_not_loaded() -> None:
    group = typer.main.get_group(app)
    assert all(isinstance(command, LazyCommand) for command in group.commands.values())
