"""`fsdp-planner launcher`: write a plan's launch bundle (torchrun / SLURM / Kubernetes) to a directory.

The plan comes from a file (`--plan plan.json`, a bare Plan or an API response holding one under
`plan`) or from a server (`--plan-id 42 [--server URL]`, `GET /api/v1/plans/42`). The archive is
the one `GET /api/v1/plans/{id}/launcher` serves: both call `executor.launch.bundle.build_bundle`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from pydantic import ValidationError
from rich.console import Console

from executor.launch.bundle import DEFAULT_IMAGE, FORMATS, TARGETS, bundle_name, write_bundle
from executor.launch.quoting import UnsafeValueError
from planner.plan import Plan

EXIT_INVALID_INPUT = 2
EXIT_UNAVAILABLE = 4
DEFAULT_SERVER = "http://127.0.0.1:8000"


def register(app: typer.Typer) -> None:
    app.command("launcher")(launcher)


def _fail(message: str, code: int = EXIT_INVALID_INPUT) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _plan_from_document(document: Any, source: str) -> Plan:
    if (
        isinstance(document, dict)
        and "schema_version" not in document
        and isinstance(document.get("plan"), dict)
    ):
        document = document["plan"]  # an API response: {"id": ..., "plan": {...}}
    if not isinstance(document, dict):
        raise _fail(f"{source}: expected a plan JSON object")
    version = str(document.get("schema_version", ""))
    if version.split(".")[0] != "1":
        raise _fail(f"{source}: plan schema_version {version or '(missing)'!r} is not supported (1.x)")
    try:
        return Plan.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        raise _fail(
            f"{source}: not a valid plan: {where}: {first['msg']} ({exc.error_count()} problem(s))"
        ) from None


def _read_plan_file(path: Path) -> Plan:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(f"--plan: cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(f"--plan: {path} is not valid JSON ({exc})") from None
    return _plan_from_document(document, str(path))


def _fetch_plan(plan_id: int, server: str, api_key: str | None) -> Plan:
    url = f"{server.rstrip('/')}/api/v1/plans/{plan_id}"
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        response = httpx.get(url, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        raise _fail(
            f"cannot reach the fsdp-planner server at {server} ({type(exc).__name__}: {exc}); start it with "
            "`fsdp-planner serve`, pass --server, or use --plan with a saved plan file",
            EXIT_UNAVAILABLE,
        ) from None
    if response.status_code == 404:
        raise _fail(f"plan {plan_id} does not exist on {server} (list plans at {server}/api/v1/plans)")
    if response.status_code in (401, 403):
        raise _fail(
            f"{server} refused the request ({response.status_code}): "
            "pass --api-key or set FSDP_PLANNER_API_KEY"
        )
    if response.status_code >= 400:
        detail = _problem_detail(response)
        raise _fail(
            f"{server} answered {response.status_code} for plan {plan_id}: {detail}", EXIT_UNAVAILABLE
        )
    try:
        document = response.json()
    except ValueError:
        raise _fail(f"{url} did not return JSON", EXIT_UNAVAILABLE) from None
    return _plan_from_document(document, url)


def _problem_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or body)[:300]
    return str(body)[:300]


def launcher(
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory to write the bundle into.")],
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="A plan JSON file (from `fsdp-planner plan -o` or the API).")
    ] = None,
    plan_id: Annotated[
        int | None, typer.Option("--plan-id", min=1, help="A stored plan's id on the server.")
    ] = None,
    server: Annotated[str, typer.Option(help="fsdp-planner server for --plan-id.")] = DEFAULT_SERVER,
    target: Annotated[str, typer.Option(help="torchrun | slurm | k8s | all")] = "all",
    fmt: Annotated[str, typer.Option("--format", help="Archive format: tar.gz | zip")] = "tar.gz",
    image: Annotated[str, typer.Option(help="Container image for the Kubernetes manifests.")] = DEFAULT_IMAGE,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="API key, if the server requires one for reads.")
    ] = None,
    no_extract: Annotated[bool, typer.Option("--no-extract", help="Write only the archive.")] = False,
) -> None:
    """Write a launch bundle: launch.sh (torchrun), slurm.sbatch, k8s.yaml, plan.json and the runtime."""
    if (plan_file is None) == (plan_id is None):
        raise _fail("give exactly one of --plan FILE or --plan-id ID")
    if target not in TARGETS:
        raise _fail(f"--target {target!r}: choose one of {', '.join(TARGETS)}")
    if fmt not in FORMATS:
        raise _fail(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if plan_file is not None:
        plan = _read_plan_file(plan_file)
    else:
        assert plan_id is not None
        plan = _fetch_plan(plan_id, server, api_key or os.environ.get("FSDP_PLANNER_API_KEY"))
    try:
        archive = write_bundle(plan, out, target=target, fmt=fmt, image=image, extract=not no_extract)  # type: ignore[arg-type]
    except UnsafeValueError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot write to {out}: {exc.strerror or exc}") from None
    console = Console()
    console.print(f"wrote {archive}", highlight=False)
    if not no_extract:
        directory = out / bundle_name(plan)
        console.print(
            f"  unpacked in {directory}; run it with:  cd {directory} && ./launch.sh --steps 20",
            highlight=False,
            soft_wrap=True,
        )
