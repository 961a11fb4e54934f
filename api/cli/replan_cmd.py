"""`fsdp-planner replan PLAN_ID`: ask the server for a plan of the same request without every
configuration predicted to need as much memory as the one that ran out (POST /plans/{id}/replan)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import (
    DEFAULT_SERVER,
    SERVER_ENV,
    STORED_ID,
    ServerClient,
    plan_answer,
    plan_from_document,
)
from api.cli.plan_cmd import VerboseOption, print_plan
from api.cli.printing import stdout_console


def register(app: typer.Typer) -> None:
    app.command("replan")(replan)


def replan(
    plan_id: Annotated[int, typer.Argument(
        parser=STORED_ID, help="The stored plan whose configuration ran out of memory.",
    )],
    run: Annotated[
        int | None,
        typer.Option(
            "--run", parser=STORED_ID,
            help="Its OOM run (default: the newest, else the plan's own configuration).",
        ),
    ] = None,
    server: Annotated[str, typer.Option(help="fsdp-planner server URL.", envvar=SERVER_ENV)] = DEFAULT_SERVER,
    api_key: Annotated[str | None, typer.Option("--api-key", help="API key, when writes need one.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Also write the Plan JSON.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Plan JSON, not the summary.")] = False,
    verbose: VerboseOption = False,
) -> None:
    """Re-plan a stored plan's request below the peak memory of its configuration that ran out of memory.

    The server runs the re-plan as a job: this follows it (a spinner) until it names the plan. Exit status:
    0 with the new (or already stored) plan; 3 when no lighter configuration fits; 2 for an unknown plan
    or run; 1 when the job failed otherwise (its reason is printed); 4 when the server cannot be reached.
    """
    client = ServerClient(server, api_key)
    body = {} if run is None else {"run_id": run}
    # A re-plan is a job on the server (202): followed until it names the plan, or says why there is none.
    stored = plan_answer(client, client.post(f"/plans/{plan_id}/replan", body))
    plan = plan_from_document(stored, f"{client.server}/api/v1/plans/{stored.get('id')}")
    document = plan.model_dump_json(indent=2)
    if output is not None:
        output.write_text(document + "\n")
    if as_json:
        typer.echo(document)
        return
    console = stdout_console()
    ceiling = stored["request"]["search"].get("max_peak_memory_gib")
    failed = stored.get("replanned_from_run_id")
    source = f"as run {failed} of plan {plan_id} did" if failed else f"as plan {plan_id}'s configuration"
    console.print(
        f"Re-planned without configurations predicted to need {ceiling:.3g} GiB per GPU or more "
        f"({source}): stored as plan {stored['id']} ({client.server}/plans/{stored['id']})\n",
        highlight=False,
    )
    print_plan(plan, console, verbose=verbose)
    if output is not None:
        console.print(f"\nPlan written to {output}")
