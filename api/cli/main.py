"""Entry point of the `fsdp-planner` console script: one Typer app, one module per command group."""

from __future__ import annotations

import typer

from api.cli import (
    calibrate_cmd,
    fidelity_cmd,
    launcher_cmd,
    plan_cmd,
    prepare_data_cmd,
    replan_cmd,
    service_cmd,
    trace_cmd,
    validate_cmd,
    whatif_cmd,
)

app = typer.Typer(
    name="fsdp-planner",
    help="Plan FSDP sharding and compilation for a model on a GPU cluster, serve plans, emit launchers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def root() -> None:
    """fsdp-planner: plan, serve, and launch compiled-FSDP training."""


plan_cmd.register(app)
replan_cmd.register(app)
service_cmd.register(app)
calibrate_cmd.register(app)
validate_cmd.register(app)
launcher_cmd.register(app)
trace_cmd.register(app)
prepare_data_cmd.register(app)
whatif_cmd.register(app)
fidelity_cmd.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
