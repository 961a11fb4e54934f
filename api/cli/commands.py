"""The command line's table of commands, loaded lazily: a command's module is imported only when it runs.

Every command module registers its commands on a Typer app (`register(app)`). Importing them all before
parsing the arguments cost every command the whole web stack, the planner and torch's helpers (issue 42:
1.5-2 s of CPU for `--help`). Here each command is named once with its module and the first paragraph of
its help, which the root's `--help` lists; the module is imported, and its real command built, only when
that command is resolved to run (or to print its own `--help`). tests/api/test_cli_imports.py holds the
listing to the modules' own help text and each command's imports to what it uses.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import typer
from typer import _click as click
from typer._click.exceptions import BadParameter, UsageError
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder


@dataclass(frozen=True, kw_only=True)
class CommandEntry:
    """One command of the root: its name, the module whose `register(app)` adds it, its summary."""

    name: str
    module: str
    summary: str
    """The first paragraph of the command's help, as the root's `--help` lists it."""


COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry(name="plan", module="api.cli.plan_cmd", summary=(
        "Find the fastest FSDP configuration that fits, and say why."
    )),
    CommandEntry(name="replan", module="api.cli.replan_cmd", summary=(
        "Re-plan a stored plan's request below the peak memory of its configuration that ran out of"
        " memory."
    )),
    CommandEntry(name="serve", module="api.cli.service_cmd", summary=(
        "Run the API (migrates the database first); OpenAPI docs at /docs."
    )),
    CommandEntry(name="worker", module="api.cli.service_cmd", summary=(
        "Run study jobs and plan jobs (large plan searches, re-plans; procrastinate on PostgreSQL) "
        "for API\n"
        "servers started with FSDP_PLANNER_JOB_ENGINE=procrastinate: start any number, on any "
        "machine, with\n"
        "the same DATABASE_URL. Each kind has its own queue, slots and search processes.\n"
        "SIGTERM/SIGINT put the running studies back in the queue for another worker; the jobs of a"
        " worker\n"
        "killed outright are retried by another one once it has been silent "
        "FSDP_PLANNER_STUDY_STALE_AFTER_S."
    )),
    CommandEntry(name="calibrate", module="api.cli.calibrate_cmd", summary=(
        "Measure GEMMs, collectives and the model's blocks here, within a time budget."
    )),
    CommandEntry(name="validate", module="api.cli.validate_cmd", summary=(
        "Run the plan's launcher for a few steps and report measured vs predicted."
    )),
    CommandEntry(name="launcher", module="api.cli.launcher_cmd", summary=(
        "Write a launch bundle: launch.sh (torchrun), slurm.sbatch, k8s.yaml, skypilot.yaml, "
        "plan.json and the\n"
        "runtime."
    )),
    CommandEntry(name="trace", module="api.cli.trace_cmd", summary=(
        "Build your model on the meta device (no weights, no memory) and write its layer graph:\n"
        "per module its parameters, forward FLOPs per token and bytes saved for backward per token,\n"
        "with repeated blocks found. Plan it with `fsdp-planner plan --layer-graph FILE` or post it\n"
        "to a server as the plan's `model`."
    )),
    CommandEntry(name="prepare-data", module="api.cli.prepare_data_cmd", summary=(
        "Tokenise text or JSONL into memory-mapped token shards + index.json for `launch.sh "
        "--data`."
    )),
    CommandEntry(name="whatif", module="api.cli.whatif_cmd", summary=(
        "How long and how much to train a model on N tokens, on each GPU type and cluster size."
    )),
    CommandEntry(name="fidelity", module="api.cli.fidelity_cmd", summary=(
        "Price every measured run of the corpus at its exact configuration; errors and targets."
    )),
    CommandEntry(name="db", module="api.cli.service_cmd", summary=(
        "Database schema migrations (Alembic)."
    )),
    CommandEntry(name="keys", module="api.cli.service_cmd", summary=(
        "API keys for writes (POST/DELETE); once one exists, writes need one."
    )),
)
"""In the order the root's `--help` lists them (Typer lists sub-apps after plain commands)."""


def describe_option(param: click.Parameter) -> None:
    """Make an option's help match what it takes, once, when its command is built: a flag takes no
    value, so it shows no `<bool>`; a number option's parser (api/cli/common.py's WholeNumber,
    DecimalNumber) holds its unit and bounds, which its help states (`Range: 1 to 1,048,576 tokens.`),
    so the help and the check read one declaration."""
    if not isinstance(param, TyperOption):
        return
    if param.is_flag:
        # Typer shows every option's Python type; a flag's metavar is all its help shows in that column.
        param.metavar = ""
        return
    describe = getattr(param.type_descriptor.parameter_info.parser, "describe", None)
    if describe is not None and describe() not in (param.help or ""):
        param.help = f"{param.help or ''} {describe()}".strip()


class PlannerCommand(TyperCommand):
    """A command whose `--help` matches its options (`describe_option`), --help itself included."""

    def __init__(self, name: str | None, **attrs: Any) -> None:
        super().__init__(name, **attrs)
        for param in self.params:
            describe_option(param)

    def get_help_option(self, ctx: click.Context) -> TyperOption | None:
        option = super().get_help_option(ctx)
        if option is not None:
            describe_option(option)
        return option


def _with_planner_commands(app: typer.Typer) -> None:
    """Build every command of `app` as a PlannerCommand, and its sub-apps (db, keys) as PlannerGroups
    whose commands are PlannerCommands: a group's `--help` is a flag like a command's."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # Typer's default
            info.cls = PlannerCommand
    for group in app.registered_groups:
        if group.typer_instance is None:
            continue
        cls = group.cls if not isinstance(group.cls, DefaultPlaceholder) else group.typer_instance.info.cls
        if isinstance(cls, DefaultPlaceholder) or cls in (None, TyperGroup):  # Typer's default
            group.cls = PlannerGroup
        _with_planner_commands(group.typer_instance)


def load_command(entry: CommandEntry) -> click.Command:
    """The real command of `entry`: its module imported, registered on an app of its own, built by Typer."""
    app = typer.Typer()
    importlib.import_module(entry.module).register(app)
    _with_planner_commands(app)
    return typer.main.get_group(app).commands[entry.name]


def one_line(error: UsageError) -> str:
    """A usage error (a bad or missing option, an unknown command) as every other refusal reads: one
    line naming the option, and where its help is; click's framed usage box says the same in five."""
    if isinstance(error, BadParameter) and error.param is not None and error.param_hint is None:
        names = getattr(error.param, "opts", None) or [error.param.name]
        message = f"{names[-1] if names[-1].startswith('--') else names[0]}: {error.message}"
    else:
        message = error.format_message()
    where = error.ctx.command_path if error.ctx is not None else "fsdp-planner"
    return f"{message.rstrip('.')}; see `{where} --help`"


def refuse_usage(error: UsageError) -> typer.Exit:
    """Print `one_line(error)` to stderr and return the Exit (code 2) to raise."""
    from rich.console import Console  # only on this path: the entry point imports nothing it may not use
    from rich.markup import escape

    line = f"[bold red]error:[/] {escape(one_line(error))}"
    Console(stderr=True).print(line, highlight=False, soft_wrap=True)
    return typer.Exit(error.exit_code)


class LazyCommand(TyperCommand):
    """What the root lists for a command not loaded yet: its name and summary; parsing its arguments
    loads the real command (once) and lets it parse."""

    def __init__(self, *, entry: CommandEntry) -> None:
        super().__init__(name=entry.name, help=entry.summary)
        self.entry = entry
        self._loaded: click.Command | None = None

    def load(self) -> click.Command:
        if self._loaded is None:
            self._loaded = load_command(self.entry)
        return self._loaded

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        return self.load().make_context(info_name, args, parent=parent, **extra)


class PlannerGroup(TyperGroup):
    """A group whose usage errors read as one line (`refuse_usage`) and whose `--help` flag shows no
    value type (`describe_option`)."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as error:
            raise refuse_usage(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        # A command's options are parsed here (its make_context), and a command may raise one too.
        try:
            return super().invoke(ctx)
        except UsageError as error:
            raise refuse_usage(error) from None

    def get_help_option(self, ctx: click.Context) -> TyperOption | None:
        option = super().get_help_option(ctx)
        if option is not None:
            describe_option(option)
        return option


class LazyGroup(PlannerGroup):
    """The root group: every command of COMMANDS listed, each loaded when it is resolved to run."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for entry in COMMANDS:
            self.commands.setdefault(entry.name, LazyCommand(entry=entry))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(command, LazyCommand):
            # Loaded once: a second resolution in this process (tests invoke the app many times) reuses it.
            self.commands[command.entry.name] = command = command.load()
        return name, command, rest
