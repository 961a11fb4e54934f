"""`fsdp-planner trace`: turn your own `nn.Module` into the layer graph the planner and the API accept.

Tracing imports and runs your model's code, so it happens here, on your machine, never on the
server. The tracer (`executor.profile.trace`) needs torch and is imported only inside the command:
the rest of the CLI, like the web service, runs without torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from api.cli.common import (
    API_KEY_ENV,
    BATCH_TOKENS,
    SEQUENCE_TOKENS,
    NetworkOption,
    ServerClient,
    cluster_from_options,
    configured_server,
    fail,
    plan_answer,
)
from api.cli.printing import stdout_console
from api.hints import EXECUTOR_EXTRA_INSTALL
from api.settings import Settings
from planner.errors import describe_validation_error
from planner.specs import ModelSpec

if TYPE_CHECKING:
    from executor.profile.trace import Trace

NEXT_STEP_CLUSTER = "1x8xH100"
"""The cluster the printed next step plans on (any cluster works)."""
NEXT_STEP_SEQUENCES = 64
"""Sequences per step in the printed next step: a multiple of the 8 GPUs of NEXT_STEP_CLUSTER."""


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)


def trace(
    factory: Annotated[
        str,
        typer.Argument(
            metavar="PACKAGE.MODULE:FACTORY", help="The function that builds and returns your nn.Module."
        ),
    ],
    arg: Annotated[
        list[str] | None,
        typer.Option(
            "--arg", metavar="NAME=VALUE", help="Keyword argument for the factory (JSON value); repeatable."
        ),
    ] = None,
    seq_len: Annotated[
        int,
        typer.Option(
            "--seq-len", parser=SEQUENCE_TOKENS, metavar="N",
            help="Tokens per sequence to trace at (use your training one)."
        ),
    ] = 2048,
    name: Annotated[
        str | None, typer.Option(help="Model name in the graph (default: the factory).")
    ] = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", metavar="FILE", help="Where to write the layer graph JSON.")
    ] = Path("graph.json"),
    as_json: Annotated[
        bool, typer.Option("--json", help="Also print the layer graph JSON on stdout.")
    ] = False,
    server: Annotated[
        str | None,
        typer.Option(
            help="Also plan the graph on this fsdp-planner server (with --cluster, --global-batch-tokens)."
        ),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(help="With --server: NODESxGPUSxGPU to plan for, e.g. 1x8xH100.")
    ] = None,
    global_batch_tokens: Annotated[
        int | None, typer.Option(
            "--global-batch-tokens", parser=BATCH_TOKENS, help="With --server: tokens per optimizer step."
        )
    ] = None,
    network: NetworkOption = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help=f"With --server: API key (or {API_KEY_ENV}).")
    ] = None,
) -> None:
    """Build your model on the meta device (no weights, no memory) and write its layer graph:
    per module its parameters, forward FLOPs per token and bytes saved for backward per token,
    with repeated blocks found. Plan it with `fsdp-planner plan --layer-graph FILE` or post it
    to a server as the plan's `model`.
    """
    if server is not None and (cluster is None or global_batch_tokens is None):
        raise fail("--server plans the graph: give --cluster NODESxGPUSxGPU and --global-batch-tokens N too")
    if server is None and network is not None:
        raise fail("--network states the cluster's network for --server's plan: give --server URL, --cluster "
                   "and --global-batch-tokens too")
    # Read here, before the trace, so that a bad cluster fails at once; the text as typed where it is all.
    planned_cluster = cluster if network is None or cluster is None else (
        cluster_from_options(cluster=cluster, network=network).model_dump(mode="json")
    )
    if importlib.util.find_spec("torch") is None:
        raise fail(
            "trace builds your model with torch: install the executor extra "
            f"(in the checkout: {EXECUTOR_EXTRA_INSTALL})"
        )
    # Like `python -m`: a factory in the current directory imports without setting PYTHONPATH.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from executor.profile.trace import TraceError, parse_factory_args, trace_factory

    try:
        result = trace_factory(factory, kwargs=parse_factory_args(arg or []), seq_len=seq_len, name=name)
    except TraceError as exc:
        raise fail(str(exc)) from None
    document = result.as_model_spec()
    try:
        ModelSpec.model_validate(document)  # exactly what the API will check
    except ValidationError as exc:
        raise fail(["the traced graph is not a valid model:", *describe_validation_error(exc)]) from None
    text = json.dumps(document, indent=2)
    try:
        output.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise fail(f"--output: cannot write {output}: {exc.strerror or exc}") from None
    if as_json:
        typer.echo(text)
    # With --json, stdout carries only the document.
    console = Console(stderr=True) if as_json else stdout_console()
    print_trace(result, console)
    if server is None:
        print_next_steps(result, output, console)
        return
    body = {
        "model": document,
        "cluster": planned_cluster,
        "training": {"seq_len": seq_len, "global_batch_tokens": global_batch_tokens},
    }
    client = ServerClient(server, api_key)
    stored = plan_answer(client, client.post("/plans", body))  # a large graph: a plan job, followed
    console.print(
        f"\nLayer graph written to {output} and planned on {client.server}: plan {stored['id']}, "
        f"{stored['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU {stored['mfu']:.1%}, "
        f"peak {stored['peak_memory_gib']:.1f} GiB per GPU",
        highlight=False, soft_wrap=True,
    )
    console.print(
        f"  {client.server}/plans/{stored['id']} (dashboard), {client.server}/api/v1/plans/{stored['id']}",
        highlight=False, soft_wrap=True,
    )


def print_trace(result: Trace, console: Console) -> None:
    """One row per unit, each block type collapsed into one row with its count."""
    console.print(
        f"[bold]{result.name}[/]: {result.num_params:,} parameters, "
        f"{_si(result.fwd_flops_per_token, 'FLOP')} forward and "
        f"{_si(result.activation_bytes_per_token, 'B', base=1024)} saved for backward per token "
        f"(bf16, seq {result.seq_len})",
        highlight=False,
    )
    table = Table(title="Layer graph (per token; a block row is one block)", title_justify="left")
    for column in ("unit", "block type", "count", "params", "fwd FLOP", "saved"):
        text = column in ("unit", "block type")
        table.add_column(column, justify="left" if text else "right", overflow="fold" if text else "ellipsis")
    types = {t.name: t for t in result.block_types}
    shown: set[str] = set()
    for unit in result.units:
        block = types.get(unit.block_type or "")
        if block is not None and block.name in shown:
            continue
        if block is not None:
            shown.add(block.name)
        table.add_row(
            unit.name if block is None or block.count == 1 else _span(block.first, block.last),
            block.name if block else "",
            str(block.count) if block else "",
            f"{unit.num_params:,}",
            _si(unit.fwd_flops_per_token, ""),
            _si(unit.activation_bytes_per_token, "B", base=1024),
        )
    console.print(table)
    if result.block_types:
        kinds = ", ".join(f"{t.count} x {t.name}" for t in result.block_types)
        console.print(f"repeated blocks (FSDP wrap and checkpoint units): {kinds}", highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    limit = Settings.model_fields["max_model_layers"].default
    if len(result.units) > limit:
        console.print(
            f"[yellow]note:[/] {len(result.units)} units: a server plans at most {limit} unless its "
            "FSDP_PLANNER_MAX_MODEL_LAYERS is raised"
        )


def _span(first: str, last: str) -> str:
    """`layers.0-31` for `layers.0` ... `layers.31`."""
    head, _, a = first.rpartition(".")
    tail_head, _, b = last.rpartition(".")
    if head == tail_head and a.isdigit() and b.isdigit():
        return f"{head}.{a}-{b}" if head else f"{a}-{b}"
    return f"{first} … {last}"


def _si(value: float, unit: str, *, base: int = 1000) -> str:
    """`8.39 M` / `11.5 KiB`: three significant digits and a prefix."""
    prefixes = ("", "K", "M", "G", "T", "P")
    step = 0
    while abs(value) >= base and step < len(prefixes) - 1:
        value /= base
        step += 1
    prefix = prefixes[step] + ("i" if base == 1024 and step else "")
    number = f"{value:.3g}" if value else "0"
    return f"{number} {prefix}{unit}".rstrip()


def print_next_steps(result: Trace, output: Path, console: Console) -> None:
    """Commands that plan the written graph, locally and on a server (FSDP_PLANNER_SERVER, else
    `fsdp-planner serve`'s default address)."""
    tokens = result.seq_len * NEXT_STEP_SEQUENCES
    path = shlex.quote(str(output))
    console.print(f"\nLayer graph written to {output}. Plan it (FLOPs were counted at seq {result.seq_len}):")
    console.print(
        f"  fsdp-planner plan --layer-graph {path} --cluster {NEXT_STEP_CLUSTER} "
        f"--seq-len {result.seq_len} --global-batch-tokens {tokens}",
        highlight=False, soft_wrap=True,
    )
    console.print("or on a server (the file is the plan's `model`):", highlight=False)
    plans_url = shlex.quote(f"{configured_server()}/api/v1/plans")
    console.print(
        f"  curl -s {plans_url} -H 'Content-Type: application/json' -d "
        f'"{{\\"model\\": $(cat {path}), \\"cluster\\": \\"{NEXT_STEP_CLUSTER}\\", '
        f'\\"training\\": {{\\"seq_len\\": {result.seq_len}, \\"global_batch_tokens\\": {tokens}}}}}"',
        highlight=False, soft_wrap=True, markup=False,
    )
