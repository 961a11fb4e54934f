"""`fsdp-planner whatif`: time and cost to train a model on a token budget across GPU types and sizes.

Plans every candidate cluster in parallel on this machine's cores (the service's search pool) and prints
one row per cluster: the chosen configuration, throughput, days to train, GPU-hours and cost, with the
time-cost Pareto front and the cheapest cluster within the deadline marked. `--server` runs the study
on a running service instead, as a job followed here with a progress bar (its plans then have launchers
to download).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli.axis_pins import AxisPins, with_axis_pins
from api.cli.common import (
    BATCH_TOKENS,
    EXIT_FAILED,
    SEQUENCE_TOKENS,
    NetworkOption,
    ServerClient,
    decimal_number,
    error_messages,
    fail,
    in_cli_terms,
    model_from_options,
    read_json_file,
    server_url,
)
from api.cli.plan_cmd import CHECKPOINT_MODES, FLOAT8_CHOICES, SHARDINGS, search_pins, within
from api.cli.printing import stdout_console
from api.typed_numbers import parse_decimal
from contract.training_config import precision_label
from planner.errors import PlanningError, describe_validation_error
from planner.formatting import duration, money, network_bandwidth, quantity
from planner.specs import ClusterSpec
from planner.study import (
    DEFAULT_PRICES_PER_GPU_HOUR,
    MAX_PRICE_PER_GPU_HOUR,
    StudyPoint,
    StudyRequest,
    StudySummary,
    parse_cluster_sizes,
    parse_token_count,
)

POLL_INTERVAL_S = 0.5
"""How often `--server` asks the server how far its study has got."""
UNFINISHED_STATES = ("queued", "running")
CLI_SEARCH_LIMIT_S = 600.0
"""CPU seconds one candidate's search may take here (the service's limit is its own setting)."""


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif)


@with_axis_pins(help_suffix=" The same on every cluster.")
def whatif(
    tokens: Annotated[str, typer.Option(help="Token budget to train on: 15T, 300B, or a plain number.")],
    model: Annotated[str | None, typer.Option(help="Catalog model name, e.g. llama3.1-405b.")] = None,
    hf_config: Annotated[
        Path | None, typer.Option("--hf-config", help="A Hugging Face config.json to study instead.")
    ] = None,
    layer_graph: Annotated[
        Path | None, typer.Option("--layer-graph", help="A layer graph JSON from `fsdp-planner trace`.")
    ] = None,
    gpu: Annotated[list[str] | None, typer.Option(
        "--gpu", metavar="[GPUSx]NAME[+FLOAT8][=USD_PER_HOUR]",
        help="A candidate GPU type from the catalog, with its price per GPU-hour (repeatable); "
        "NAME+tensorwise trains it with a Float8 recipe, so --gpu H100 --gpu H100+tensorwise compares "
        "bf16 and Float8 side by side; GPUSxNAME counts one node (4xH100) or, as --cluster does, one "
        "scale-up domain where it spans nodes (36xGB200: NVL36 racks; default NVL72); "
        "default prices: " + ", ".join(f"{k} ${v:g}" for k, v in DEFAULT_PRICES_PER_GPU_HOUR.items()) + ".",
    )] = None,
    gpu_file: Annotated[list[Path] | None, typer.Option(
        "--gpu-file", help="A JSON candidate of your own (repeatable): {\"gpu\": NAME, \"custom_gpu\": "
        "{datasheet, see GET /api/v1/gpus}, \"price_per_gpu_hour\": USD}, or a list of them.",
    )] = None,
    sizes: Annotated[str, typer.Option(
        help="Cluster sizes in GPUs: a list (64,128,512), a doubling range (8-4096) or a stepped one "
        "(64-512:+64).",
    )] = "8-1024",
    network: NetworkOption = None,
    seq_len: Annotated[int, typer.Option(
        "--seq-len", parser=SEQUENCE_TOKENS, help="Tokens per sequence.",
    )] = 4096,
    global_batch_tokens: Annotated[int | None, typer.Option(
        "--global-batch-tokens", parser=BATCH_TOKENS,
        help="Tokens per optimizer step, the same on every cluster.",
    )] = None,
    batch_tokens_per_gpu: Annotated[int | None, typer.Option(
        "--batch-tokens-per-gpu", parser=BATCH_TOKENS,
        help="Tokens per step per GPU instead: the batch grows with the cluster.",
    )] = None,
    deadline_days: Annotated[float | None, typer.Option(
        "--deadline-days", parser=decimal_number(unit="days"),
        help="Name the cheapest cluster that trains within this many days.",
    )] = None,
    precision: Annotated[str, typer.Option(help="bf16 (mixed, fp32 master) or fp32.")] = "bf16",
    state_dtype: Annotated[str, typer.Option(
        "--state-dtype", help="float32 (mixed precision) or bfloat16 (pure bf16 training, no fp32 master).",
    )] = "float32",
    axis_pins: AxisPins = None,
    sharding: Annotated[list[str] | None, typer.Option(
        "--sharding", metavar="STRATEGY[,...]", help=f"Pin the sharding strategies: {', '.join(SHARDINGS)}.",
    )] = None,
    checkpointing: Annotated[list[str] | None, typer.Option(
        "--checkpointing", metavar="MODE[,...]", help=f"Pin the AC modes: {', '.join(CHECKPOINT_MODES)}.",
    )] = None,
    name: Annotated[str | None, typer.Option(help="A name for the study (with --server).")] = None,
    server: Annotated[str | None, typer.Option(
        help="Store the study on this fsdp-planner service (e.g. http://127.0.0.1:8000) instead of "
        "planning here; its plans get launchers there.",
    )] = None,
    api_key: Annotated[
        str | None, typer.Option(help="API key for --server (or FSDP_PLANNER_API_KEY).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the study as JSON.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the study JSON here.")] = None,
) -> None:
    """How long and how much to train a model on N tokens, on each GPU type and cluster size."""
    candidates = [_catalog_gpu(text) for text in gpu or []]
    for path in gpu_file or []:
        document = read_json_file(path, "--gpu-file")
        candidates.extend(document if isinstance(document, list) else [document])
    if not candidates:
        raise fail("give at least one candidate GPU type: --gpu H100 (repeatable) or --gpu-file FILE")
    search = search_pins(axis_pins=axis_pins, sharding=sharding, checkpointing=checkpointing)
    body: dict[str, Any] = {
        "token_budget": _parsed(parse_token_count, tokens, "--tokens"), "gpus": candidates,
        "cluster_sizes": _parsed(parse_cluster_sizes, sizes, "--sizes"),
        "seq_len": seq_len, "precision": precision, "state_dtype": state_dtype,
        "search": search.model_dump(mode="json"),
        **({"batch_rule": "per_gpu", "batch_tokens_per_gpu": batch_tokens_per_gpu}
           if batch_tokens_per_gpu is not None else {"global_batch_tokens": global_batch_tokens}),
        **({"deadline_days": deadline_days} if deadline_days is not None else {}),
        **({"inter_node_bandwidth_gbps": network} if network is not None else {}),
    }
    if global_batch_tokens is None and batch_tokens_per_gpu is None:
        raise fail("give --global-batch-tokens (fixed batch) or --batch-tokens-per-gpu (batch grows with the "
                   "cluster)")
    if server is not None:
        _on_server(server, api_key, body, model=model, hf_config=hf_config, layer_graph=layer_graph,
                   name=name, as_json=as_json, output=output)
        return
    try:
        study = StudyRequest.model_validate(
            {**body, "model": model_from_options(model=model, hf_config=hf_config, layer_graph=layer_graph)}
        )
    except ValidationError as exc:
        raise fail([_candidate_named(line, gpu or []) for line in describe_validation_error(exc)]) from None
    except PlanningError as exc:
        raise fail(exc.message) from None
    if any(gpu.calibration_id is not None for gpu in study.gpus):
        raise fail("calibration_id names a profile stored on a service: add --server URL to plan there "
                   "(here, studies plan with catalog peaks)")
    summary = _plan_here(study)
    document = json.dumps({"request": study.model_dump(mode="json"), **summary.model_dump(mode="json")},
                          indent=2)
    if output is not None:
        output.write_text(document + "\n")
    if as_json:
        typer.echo(document)
        return
    print_study(study, summary, stdout_console())
    if output is not None:
        stdout_console().print(f"\nStudy written to {output}")


def _plan_here(study: StudyRequest) -> StudySummary:
    # The study runner lives beside the service's (its module also stores studies, with sqlalchemy):
    # imported when a study is planned here, not for `whatif --help` or a study sent to a server.
    from api.services.search_pool import SearchPool, available_cores
    from api.services.studies import run_study

    count = len([c for c in study.candidates() if c.request is not None])
    pool = SearchPool(workers=available_cores(), deadline_s=CLI_SEARCH_LIMIT_S)
    progress = Progress(TextColumn("planning {task.total} clusters"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    try:
        with progress:
            task = progress.add_task("plan", total=count)
            summary, _ = run_study(study, pool, on_done=lambda done: progress.update(task, completed=done))
    finally:
        pool.shutdown()
    return summary


def _on_server(server: str, api_key: str | None, body: dict[str, Any], *, model: str | None,
               hf_config: Path | None, layer_graph: Path | None, name: str | None, as_json: bool,
               output: Path | None) -> None:
    if model is not None:
        body["model"] = model
    else:
        source = hf_config or layer_graph
        if source is None:
            raise fail("give exactly one of --model NAME, --hf-config PATH or --layer-graph PATH")
        body["model"] = read_json_file(source, "--hf-config" if hf_config else "--layer-graph")
    if name is not None:
        body["name"] = name
    client = ServerClient(server, api_key)
    stored = follow_study(client, client.post("/studies", body))
    document = json.dumps(stored, indent=2)
    if output is not None:
        output.write_text(document + "\n")
    if as_json:
        typer.echo(document)
        return
    study = StudyRequest.model_validate(stored["request"])
    points = tuple(StudyPoint.model_validate(p) for p in stored["points"])
    summary = StudySummary(points=points, fastest=stored["fastest"], cheapest=stored["cheapest"],
                           cheapest_within_deadline=stored["cheapest_within_deadline"])
    print_study(study, summary, stdout_console())
    stdout_console().print(f"\nStored as study {stored['id']}: {server_url(server)}/studies/{stored['id']}")


_CANDIDATE = re.compile(r"^gpus\.(\d+)(\.[\w.]+)?: ")


def _candidate_named(line: str, typed: list[str]) -> str:
    """A problem of the study's `gpus.N` candidate named by the option that gave it: `--gpu RTX4090:`
    for the N-th --gpu, `--gpu-file (candidate 2), gpu:` for one read from a file."""
    match = _CANDIDATE.match(line)
    if match is None:
        return line
    index, field = int(match.group(1)), (match.group(2) or "").removeprefix(".")
    if index < len(typed):
        where = f"--gpu {typed[index]}"
    else:
        where = f"--gpu-file (candidate {index - len(typed) + 1})" + (f", {field}" if field else "")
    return f"{where}: {line[match.end():]}"


def follow_study(client: ServerClient, study: dict[str, Any]) -> dict[str, Any]:
    """Follow a study's job on the server with a progress bar until it has finished; the succeeded study.

    A failed or cancelled study exits with its reason; Ctrl-C stops following, not the study.
    """
    study_id = study["id"]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    try:
        with progress:
            task = progress.add_task(f"study {study_id} {study['state']}", total=study["num_candidates"])
            while study["state"] in UNFINISHED_STATES:
                time.sleep(POLL_INTERVAL_S)
                study = client.get(f"/studies/{study_id}",
                                   not_found=f"study {study_id} was deleted on the server while it ran")
                progress.update(task, completed=study["candidates_done"], description=(
                    f"study {study_id} {study['state']}, {study['num_fitting']} fit so far"))
    except KeyboardInterrupt:
        raise fail(f"stopped following study {study_id}; it goes on on the server: "
                   f"{client.server}/studies/{study_id} (cancel: POST /api/v1/studies/{study_id}/cancel)",
                   EXIT_FAILED) from None
    if study["state"] == "failed":
        raise fail(f"study {study_id} failed on the server: {study['error']}", EXIT_FAILED)
    if study["state"] == "cancelled":
        raise fail(f"study {study_id} was cancelled on the server before it finished", EXIT_FAILED)
    return study


def _parsed(parse: Callable[[str], Any], text: str, option: str) -> Any:
    try:
        return parse(text)
    except ValueError as exc:
        raise fail(f"{option}: {exc}") from None


def _catalog_gpu(text: str) -> dict[str, Any]:
    """`H100`, `H100=2.49`, `H100+tensorwise=2.49` (Float8) or `36xGB200=4.5` (its domain) -> a StudyGpu
    body."""
    name, sep, price = text.partition("=")
    gpu_name, plus, recipe = name.partition("+")
    body = _gpu_type(gpu_name.strip(), text)
    if plus:
        if recipe.strip() not in FLOAT8_CHOICES or recipe.strip() == "none":
            raise fail(f"--gpu {text!r}: after '+' comes a Float8 recipe ({', '.join(FLOAT8_CHOICES[1:])}), "
                       "e.g. --gpu H100+tensorwise")
        body["float8"] = recipe.strip()
    if not sep:
        return body
    value = parse_decimal(price)  # ASCII digits only: float() reads '٣' as 3
    if value is None:
        raise fail(f"--gpu {text!r}: the price after '=' must be USD per GPU-hour in the digits 0-9, e.g. "
                   "--gpu H100=2.49")
    if not 0 < value <= MAX_PRICE_PER_GPU_HOUR:  # the bounds of StudyGpu.price_per_gpu_hour
        raise fail(f"--gpu {text!r}: the price after '=' is out of range: give more than 0 and at most "
                   f"{MAX_PRICE_PER_GPU_HOUR:,g} USD per GPU-hour")
    return {**body, "price_per_gpu_hour": value}


def _gpu_type(name: str, text: str) -> dict[str, Any]:
    """`H100` -> {gpu}; `4xH100` (one node) or `36xGB200` (one scale-up domain) -> {gpu, gpus_per_node,
    scaleup_domain_gpus}, read as `--cluster` reads the count (ClusterSpec.parse), for one node or domain:
    the study's sizes give how many."""
    if not name[:1].isdigit():
        return {"gpu": name}
    try:
        spec = ClusterSpec.parse(name)
    except ValidationError as exc:
        raise fail([f"--gpu {text!r}: {line}" for line in error_messages(exc)]) from None
    if spec.world_size != spec.scaleup_gpus:
        raise fail(f"--gpu {text!r}: give the GPUs of one node or one scale-up domain (e.g. 36xGB200); "
                   "--sizes gives how many GPUs each candidate cluster has")
    return {"gpu": spec.gpu, "gpus_per_node": spec.gpus_per_node,
            **({"scaleup_domain_gpus": spec.scaleup_domain_gpus} if spec.scaleup_domain_gpus else {})}


def print_study(study: StudyRequest, summary: StudySummary, console: Console) -> None:
    """One row per fitting cluster, cheapest first, the picks marked; then the clusters that do not fit."""
    console.print(
        f"[bold]{study.model.name}[/] on {quantity(study.token_budget)} tokens, seq {study.seq_len}, "
        + (f"{study.global_batch_tokens:,} tokens/step" if study.batch_rule == "fixed"
           else f"{study.batch_tokens_per_gpu:,} tokens/step per GPU")
        + (f", deadline {study.deadline_days:g} days" if study.deadline_days else "")
        + (f", network {network_bandwidth(study.inter_node_bandwidth_gbps)}"
           if study.inter_node_bandwidth_gbps is not None else "")
        + (f", {precision_label(study.precision, study.state_dtype)}"
           if study.state_dtype == "bfloat16" else "")
    )
    table = Table(title_justify="left")
    table.add_column("GPU", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    table.add_column("config", overflow="fold")
    for column in ("step", "tok/s/GPU", "MFU", "peak GiB", "days", "GPU-hours", "cost"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("", overflow="fold")
    picks = {summary.fastest: "fastest", summary.cheapest: "cheapest",
             summary.cheapest_within_deadline: "cheapest in deadline"}
    fitting = sorted((i for i, p in enumerate(summary.points) if p.fits),
                     key=lambda i: (summary.points[i].cost, i))
    for index in fitting:
        p = summary.points[index]
        marks = [m for i, m in picks.items() if i == index] + (["pareto"] if p.pareto else [])
        table.add_row(
            p.series, f"{p.num_gpus} ({p.num_nodes}x{p.gpus_per_node})", p.config_label,
            duration(p.step_time_s or 0.0),
            f"{p.tokens_per_s_per_gpu:,.0f}{within(p.tokens_per_s_per_gpu_interval)}", f"{p.mfu:.0%}",
            f"{p.peak_memory_gib:.1f}{within(p.peak_memory_gib_interval, decimals=1)}",
            f"{p.days:,.1f}{within(p.days_interval, decimals=1)}", quantity(p.gpu_hours or 0.0),
            money(p.cost or 0.0), ", ".join(marks),
            style="bold green" if index == summary.cheapest_within_deadline else None,
        )
    if fitting:
        console.print(table)
        if any(summary.points[i].tokens_per_s_per_gpu_interval for i in fitting):
            console.print("In brackets: the 80% interval (four measured runs in five like it fell inside).",
                          style="dim", highlight=False)
    else:
        console.print("[red]No candidate cluster fits this model.[/]")
    refused = [p for p in summary.points if not p.fits]
    if refused:
        console.print("Clusters that cannot train it:")
        for p in refused:
            console.print(f"  {p.label} ({p.num_gpus} GPUs): {in_cli_terms(p.reason or '')}", highlight=False,
                          soft_wrap=True)
    if study.deadline_days is not None and summary.cheapest_within_deadline is None and fitting:
        console.print(f"[yellow]No cluster trains within {study.deadline_days:g} days[/]: add larger sizes "
                      "or faster GPU types, or allow more time.")
