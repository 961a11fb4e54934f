"""Entry point of the `fsdp-planner` console script: one Typer app whose commands load when they run.

This module imports Typer and the table of commands only (api/cli/commands.py): a command's own module,
and what it needs (the planner, the web stack, torch), is imported once that command is chosen.
"""

from __future__ import annotations

import typer

from api.cli.commands import LazyGroup
from api.cli.exit_codes import epilog

app = typer.Typer(
    name="fsdp-planner",
    cls=LazyGroup,
    help="Plan FSDP sharding and compilation for a model on a GPU cluster, serve plans, emit launchers.",
    epilog=epilog(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def root() -> None:
    """fsdp-planner: plan, serve, and launch compiled-FSDP training."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
