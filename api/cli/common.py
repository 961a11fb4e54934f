"""What every command shares: failing with a clear message, reading JSON files, talking to a server."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from api.typed_numbers import parse_decimal, parse_whole
from contract.mesh import searched_axes
from contract.plan_document import PlanError, schema_major, unwrap
from planner.catalog.models import resolve_model
from planner.errors import describe_validation_error
from planner.plan import Plan
from planner.specs import ClusterSpec, ModelSpec

if TYPE_CHECKING:
    import httpx

EXIT_FAILED = 1
EXIT_INVALID_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_UNAVAILABLE = 4
EXIT_OOM = 5
"""`validate`: the plan's launcher ran out of memory (the run is stored as an OOM run with --upload)."""
API_KEY_ENV = "FSDP_PLANNER_API_KEY"


CLI_OPTIONS: dict[str, str] = {
    # Each mesh axis's pin (contract/mesh.py's registry): `search.tensor_parallel_degrees` -> `--tp`.
    **{
        name: entry.option
        for entry in searched_axes()
        if entry.search_field and entry.option
        for name in (f"search.{entry.search_field}", entry.search_field)
    },
    "search.shardings": "--sharding",
    "search.checkpointing": "--checkpointing",
    "search.compile": "--compile/--eager",
    "search.float8": "--float8",
    "search.async_tp": "--async-tp",
    "search.pipeline_schedules": "--pp-schedule",
    "pipeline_schedules": "--pp-schedule",
    "training.seq_len": "--seq-len",
    "seq_len": "--seq-len",
    "training.global_batch_tokens": "--global-batch-tokens",
    "global_batch_tokens": "--global-batch-tokens",
    "training.precision": "--precision",
    "training.state_dtype": "--state-dtype",
    "gpus_per_node": "--cluster's GPUs per node",
    "top_k": "--top",
    "token_budget": "--tokens",
    "cluster_sizes": "--sizes",
    "batch_tokens_per_gpu": "--batch-tokens-per-gpu",
    "deadline_days": "--deadline-days",
}
"""The option that sets each input the planner's messages name. The planner words its messages once,
naming an input by its API field (`search.tensor_parallel_degrees`, `global_batch_tokens`), which is
what the API shows; the command line shows the option instead (`in_cli_terms`). Leaf names that are
also plain words (`compile`, `precision`) are mapped only in their dotted form; a count the option
holds among others is named with it (`gpus_per_node 8` -> `--cluster's GPUs per node 8`)."""

_FIELD_NAME = re.compile(
    # Longest first, so that `training.seq_len` is one name; not inside a longer name (`max_seq_len`,
    # `model.seq_len`) or an option (`--seq-len`).
    r"(?<![\w.-])("
    + "|".join(re.escape(name) for name in sorted(CLI_OPTIONS, key=len, reverse=True))
    + r")(?!\w)"
)


MAX_TYPED_NUMBER = 10**15
"""Larger than any count, size or duration typed on the command line (the planner bounds each further)."""


def whole_number(*, low: int = 0, high: int | None = None) -> Callable[[str | int], int]:
    """A parser for a whole-number option, read as every number typed as text is (api.typed_numbers:
    ASCII digits, bounded): `int()` would read '٣' as 3. Defaults arrive as numbers already."""
    bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"

    def parse(raw: str | int) -> int:
        if isinstance(raw, int):
            return raw
        value = parse_whole(raw, low=low, high=high if high is not None else MAX_TYPED_NUMBER)
        if value is None:
            raise typer.BadParameter(f"{raw!r} is not a whole number {bounds} in the digits 0-9")
        return value

    return parse


def decimal_number(*, low: float = 0.0, high: float | None = None) -> Callable[[str | float], float]:
    """A parser for a decimal option (`2.5`, `1e3`): ASCII digits only, finite and bounded."""
    bounds = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"

    def parse(raw: str | float) -> float:
        if isinstance(raw, int | float):
            return float(raw)
        value = parse_decimal(raw, low=low, high=high if high is not None else float(MAX_TYPED_NUMBER))
        if value is None:
            raise typer.BadParameter(f"{raw!r} is not a number {bounds} in the digits 0-9")
        return value

    return parse


def in_cli_terms(message: str) -> str:
    """`message` with every input field it names replaced by the option that sets it:
    `search.tensor_parallel_degrees: tp=3 must divide ...` -> `--tp: tp=3 must divide ...`."""
    return _FIELD_NAME.sub(lambda match: CLI_OPTIONS[match.group(1)], message)


def fail(message: str | list[str], code: int = EXIT_INVALID_INPUT) -> typer.Exit:
    """Print `error: ...` lines to stderr, in the command line's terms, and return the Exit to raise."""
    err = Console(stderr=True)
    for line in [message] if isinstance(message, str) else message:
        err.print(f"[bold red]error:[/] {in_cli_terms(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def read_json_file(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise fail(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise fail(f"{what}: {path} is not valid JSON ({exc})") from None


def check_one_model(model: str | None, hf_config: Path | None, layer_graph: Path | None) -> None:
    if sum(x is not None for x in (model, hf_config, layer_graph)) != 1:
        raise fail("give exactly one of --model NAME, --hf-config PATH or --layer-graph PATH")


def model_from_options(*, model: str | None, hf_config: Path | None, layer_graph: Path | None) -> ModelSpec:
    """The model of `--model`, `--hf-config` or `--layer-graph` (raises PlanningError / ValidationError)."""
    check_one_model(model, hf_config, layer_graph)
    if model is not None:
        return resolve_model(model)
    if hf_config is not None:
        return resolve_model(read_json_file(hf_config, "--hf-config"))
    assert layer_graph is not None
    return resolve_model(read_json_file(layer_graph, "--layer-graph"))


def cluster_from_options(*, cluster: str | None, cluster_file: Path | None = None) -> ClusterSpec:
    """The cluster of `--cluster NODESxGPUSxGPU` or `--cluster-file FILE` (exactly one), read by the
    planner's one parser with the bounds of every other spelling; a bad one fails with one line per
    problem (exit 2), naming the format or the bound."""
    if (cluster is None) == (cluster_file is None):
        raise fail("give exactly one of --cluster NODESxGPUSxGPU or --cluster-file FILE")
    try:
        if cluster is not None:
            return ClusterSpec.parse(cluster)
        assert cluster_file is not None
        return ClusterSpec.model_validate(read_json_file(cluster_file, "--cluster-file"))
    except ValidationError as exc:
        raise fail(describe_validation_error(exc, prefix="cluster")) from None


class ServerClient:
    """JSON calls to an fsdp-planner server, every failure turned into one actionable line."""

    def __init__(self, server: str, api_key: str | None = None, *, timeout_s: float = 60.0) -> None:
        self.server = server.rstrip("/")
        self.api_key = api_key or os.environ.get(API_KEY_ENV)
        self.timeout_s = timeout_s

    def get(self, path: str, *, not_found: str | None = None) -> Any:
        """`not_found`: the message for a 404 (what is missing and where to look)."""
        return self._call("GET", path, None, not_found=not_found)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: Any, *, not_found: str | None = None) -> Any:
        url = f"{self.server}/api/v1{path}"
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        # httpx (0.2-0.4 s of CPU to import) only for the commands that talk to a server, when they do.
        import httpx

        try:
            response = httpx.request(method, url, headers=headers, json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise fail(
                f"cannot reach the fsdp-planner server at {self.server} ({type(exc).__name__}: {exc}); "
                "start it with `fsdp-planner serve` or pass --server",
                EXIT_UNAVAILABLE,
            ) from None
        if response.status_code == 404 and not_found is not None:
            raise fail(not_found)
        if response.status_code in (401, 403):
            raise fail(
                f"{self.server} refused {method} {path} ({response.status_code}): pass --api-key or set "
                f"{API_KEY_ENV}"
            )
        if response.status_code >= 400:
            code = EXIT_INVALID_INPUT if response.status_code < 500 else EXIT_UNAVAILABLE
            if _problem_type(response).endswith(":infeasible-plan"):
                code = EXIT_INFEASIBLE  # as `plan` exits when nothing fits
            raise fail(
                f"{self.server} answered {response.status_code} to {method} {path}: "
                f"{problem_detail(response)}",
                code,
            )
        try:
            return response.json()
        except ValueError:
            raise fail(f"{url} did not return JSON", EXIT_UNAVAILABLE) from None


def _problem_type(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("type", "")) if isinstance(body, dict) else ""


def problem_detail(response: httpx.Response) -> str:
    """The human part of an error response (a problem's `detail`), shortened."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or body)[:300]
    return str(body)[:300]


DEFAULT_SERVER = "http://127.0.0.1:8000"
"""Where `fsdp-planner serve` listens by default."""
SERVER_ENV = "FSDP_PLANNER_SERVER"
"""The server URL commands use when not given --server (validate, replan, launcher; trace's hint)."""


def configured_server() -> str:
    """The server a command talks to without --server: FSDP_PLANNER_SERVER, else serve's default."""
    return (os.environ.get(SERVER_ENV) or DEFAULT_SERVER).rstrip("/")


def cpu_precision_note(plan: Plan) -> str | None:
    """Why a bf16 plan for a CPU cluster will not predict its CPU run (None when that does not apply).

    The trainer runs CPU jobs in float32 (`--precision auto`): bf16 matmuls are slow on most CPUs.
    """
    if not plan.cluster.gpu_spec.is_cpu or plan.training.precision != "bf16":
        return None
    return ("this plan assumes bf16 but CPU runs train in float32, so their time and memory differ from "
            "the prediction; plan CPU runs with --precision fp32")


def plan_from_document(document: Any, source: str) -> Plan:
    """A Plan from a plan file or an API response (`{"id": ..., "plan": {...}}`); anything else refused."""
    document = unwrap(document)
    try:
        schema_major(document)
    except PlanError as exc:
        raise fail(f"{source}: {exc}") from None
    try:
        return Plan.model_validate(document)
    except ValidationError as exc:
        lines = describe_validation_error(exc, prefix="plan")
        raise fail([f"{source}: not a valid plan ({len(lines)} problem(s))", *lines[:5]]) from None


def load_plan(plan_file: Path | None, plan_id: int | None, server: str, api_key: str | None) -> Plan:
    """The plan named by `--plan FILE` or `--plan-id ID [--server URL]` (exactly one of them)."""
    if (plan_file is None) == (plan_id is None):
        raise fail("give exactly one of --plan FILE or --plan-id ID")
    if plan_file is not None:
        return plan_from_document(read_json_file(plan_file, "--plan"), str(plan_file))
    client = ServerClient(server, api_key)
    document = client.get(
        f"/plans/{plan_id}",
        not_found=f"plan {plan_id} does not exist on {client.server} "
        f"(list plans at {client.server}/api/v1/plans)",
    )
    return plan_from_document(document, f"{client.server}/api/v1/plans/{plan_id}")


PLAN_JOB_POLL_S = 0.5


def is_plan_job(answer: Any) -> bool:
    """Whether a POST answered with a plan job (202: a re-plan, or a plan beyond the job threshold)."""
    return isinstance(answer, dict) and "kind" in answer and "state" in answer and "plan" not in answer


def follow_plan_job(client: ServerClient, job: dict[str, Any]) -> dict[str, Any]:
    """Follow a plan job on the server (a spinner on stderr) until it has finished; then the stored plan
    (GET /plans/{plan_id}). A failed job exits with its reason, as the synchronous request would have
    (3 when nothing fits); Ctrl-C stops following, not the job."""
    import time

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    job_id = job["id"]
    what = "re-plan" if job.get("kind") == "replan" else "plan search"
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    try:
        with progress:
            task = progress.add_task(f"{what} job {job_id} {job['state']}", total=None)
            while job["state"] in ("queued", "running"):
                time.sleep(PLAN_JOB_POLL_S)
                job = client.get(f"/plan-jobs/{job_id}",
                                 not_found=f"plan job {job_id} is gone from the server")
                progress.update(task, description=f"{what} job {job_id} {job['state']}")
    except KeyboardInterrupt:
        raise fail(f"stopped following plan job {job_id}; it goes on on the server: "
                   f"{client.server}/plan-jobs/{job_id}", EXIT_FAILED) from None
    if job["state"] != "succeeded":
        problem = job.get("problem") or {}
        code = EXIT_FAILED
        if str(problem.get("type", "")).endswith(":infeasible-plan"):
            code = EXIT_INFEASIBLE
        elif 400 <= int(problem.get("status") or 500) < 500:
            code = EXIT_INVALID_INPUT
        raise fail(f"{what} job {job_id} failed on the server: {job.get('error')}", code)
    return client.get(f"/plans/{job['plan_id']}",
                      not_found=f"plan {job['plan_id']} was deleted on the server")


def plan_answer(client: ServerClient, answer: Any) -> Any:
    """A POST /plans (or re-plan) answer as a stored plan: a plan job is followed to its plan."""
    return follow_plan_job(client, answer) if is_plan_job(answer) else answer
