"""`fsdp-planner plan`: plan a catalog model or a Hugging Face config on a cluster, print or save it."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from api.cli.axis_pins import AxisPins, choices, pinned_degrees, with_axis_pins
from api.cli.common import (
    BATCH_TOKENS,
    EXIT_INFEASIBLE,
    SEQUENCE_TOKENS,
    NetworkOption,
    check_one_model,
    cluster_from_options,
    cpu_precision_note,
    fail,
    field_bounds,
    in_cli_terms,
    model_from_options,
    network_unused,
    read_json_file,
    whole_number,
)
from api.cli.printing import stdout_console
from contract.mesh import exposed_comm_axes
from contract.parallel_config import (
    PIPELINE_SCHEDULES,
    CheckpointMode,
    Float8Recipe,
    ParallelConfig,
    PipelineConfig,
    ShardingStrategy,
)
from contract.training_config import precision_label
from planner.calibration import CalibrationProfile
from planner.cost.memory import MEMORY_TERMS
from planner.errors import InfeasiblePlanError, PlanningError, describe_validation_error
from planner.formatting import between, duration, network_bandwidth, quantity
from planner.plan import EXPERT_MEMORY_LABELS, ExpertMemory, Plan, PredictionInterval
from planner.precheck import read_request
from planner.rejected_summary import summarize_rejected
from planner.search import make_plan
from planner.specs import PlanRequest, SearchSpace

SHARDINGS: tuple[str, ...] = typing.get_args(ShardingStrategy)
CHECKPOINT_MODES: tuple[str, ...] = typing.get_args(CheckpointMode)
FLOAT8_CHOICES: tuple[str, ...] = typing.get_args(Float8Recipe)
TOP_LOW, TOP_HIGH = field_bounds(PlanRequest, "top_k")
VerboseOption = Annotated[bool, typer.Option(
    "--verbose", "-v", help="List every family that lost; without it the out-of-memory ones share one row."
)]


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


@with_axis_pins()
def plan(
    model: Annotated[str | None, typer.Option(help="Catalog model name, e.g. llama3-8b.")] = None,
    hf_config: Annotated[
        Path | None, typer.Option("--hf-config", help="A Hugging Face config.json to plan instead.")
    ] = None,
    layer_graph: Annotated[
        Path | None,
        typer.Option("--layer-graph", help="A layer graph JSON from `fsdp-planner trace` to plan instead."),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(help=(
            "NODESxGPUSxGPU, e.g. 1x8xH100 or 4x8xA100-80GB; racks whose NVLink spans nodes as "
            "RACKSxGPUSxGPU, e.g. 4x72xGB200."
        ))
    ] = None,
    cluster_file: Annotated[
        Path | None,
        typer.Option("--cluster-file", help="JSON cluster spec (num_nodes, gpus_per_node, gpu, ...)."),
    ] = None,
    network: NetworkOption = None,
    seq_len: Annotated[int, typer.Option(
        "--seq-len", parser=SEQUENCE_TOKENS, help="Tokens per sequence.",
    )] = 2048,
    global_batch_tokens: Annotated[
        int | None, typer.Option(
            "--global-batch-tokens", parser=BATCH_TOKENS, help="Tokens per optimizer step (all GPUs).",
        )
    ] = None,
    precision: Annotated[str, typer.Option(
        help="bf16 (mixed, fp32 master) or fp32; CPU clusters train in fp32, so plan them with fp32."
    )] = "bf16",
    state_dtype: Annotated[str, typer.Option(
        "--state-dtype",
        help="What the optimizer updates: float32 (parameters, gradients and AdamW states beside the bf16 "
        "compute copies) or bfloat16 (pure bf16 training, no fp32 master: half their memory; needs "
        "--precision bf16).",
    )] = "float32",
    calibration: Annotated[
        Path | None, typer.Option(help="CalibrationProfile JSON from `fsdp-planner calibrate`.")
    ] = None,
    sharding: Annotated[list[str] | None, typer.Option(
        "--sharding", metavar="STRATEGY[,...]",
        help=f"Pin the sharding strategies to search (repeatable or comma-separated): "
        f"{', '.join(SHARDINGS)}. Default: all.",
    )] = None,
    compile_: Annotated[bool | None, typer.Option(
        "--compile/--eager",
        help="Pin torch.compile (SimpleFSDP) or eager FSDP2. Default: search both.",
    )] = None,
    checkpointing: Annotated[list[str] | None, typer.Option(
        "--checkpointing", metavar="MODE[,...]",
        help=f"Pin the activation checkpointing modes to search (repeatable or comma-separated): "
        f"{', '.join(CHECKPOINT_MODES)}. Default: all.",
    )] = None,
    float8: Annotated[list[str] | None, typer.Option(
        "--float8", metavar="RECIPE[,...]",
        help=f"Float8 training recipes to search beside the compute precision (repeatable or "
        f"comma-separated): {', '.join(FLOAT8_CHOICES)}; H100, H200 and B200 only (mxfp8: B200). "
        "Default: none (bf16).",
    )] = None,
    axis_pins: AxisPins = None,
    pp_schedule: Annotated[list[str] | None, typer.Option(
        "--pp-schedule", metavar="NAME[,NAME...]",
        help=f"Pipeline schedules to search when pp > 1 (repeatable or comma-separated): "
        f"{', '.join(PIPELINE_SCHEDULES)}. Default: all.",
    )] = None,
    async_tp: Annotated[bool, typer.Option(
        "--async-tp",
        help="Run compiled tensor-parallel plans' collectives asynchronously (inductor's "
        "micro-pipelined TP over CUDA symmetric memory), priced as overlapping their matmuls.",
    )] = False,
    top: Annotated[int, typer.Option(
        "--top", parser=whole_number(unit="configurations", low=TOP_LOW, high=TOP_HIGH),
        help="Ranked alternatives to show.",
    )] = 5,
    verbose: VerboseOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Plan document as JSON.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the Plan JSON here.")] = None,
) -> None:
    """Find the fastest FSDP configuration that fits, and say why."""
    check_one_model(model, hf_config, layer_graph)
    cluster_spec = cluster_from_options(cluster=cluster, cluster_file=cluster_file, network=network)
    if global_batch_tokens is None:
        raise fail("--global-batch-tokens is required (tokens per optimizer step over all GPUs)")
    search = search_pins(
        axis_pins=axis_pins, sharding=sharding, compile_=compile_, checkpointing=checkpointing,
        float8=float8, async_tp=async_tp, pp_schedule=pp_schedule,
    )
    try:
        model_spec = model_from_options(model=model, hf_config=hf_config, layer_graph=layer_graph)
        request = read_request({
            "model": model_spec,
            "cluster": cluster_spec,
            # As typed: a batch of partial sequences is refused with batches that plan on this cluster.
            "training": {
                "seq_len": seq_len, "global_batch_tokens": global_batch_tokens, "precision": precision,
                "state_dtype": state_dtype,
            },
            "search": search,
            "top_k": top,
        })
        profile = (
            CalibrationProfile.model_validate(read_json_file(calibration, "--calibration"))
            if calibration is not None
            else None
        )
        result = make_plan(
            request,
            calibration=profile,
            calibration_id=(profile.name or calibration.stem) if profile and calibration else None,
        )
    except ValidationError as exc:
        raise fail(describe_validation_error(exc)) from None
    except InfeasiblePlanError as exc:
        raise fail(exc.message, EXIT_INFEASIBLE) from None
    except PlanningError as exc:
        raise fail(exc.message) from None

    document = result.model_dump_json(indent=2)
    if output is not None:
        output.write_text(document + "\n")
    if as_json:
        typer.echo(document)
    else:
        print_plan(result, stdout_console(), verbose=verbose)
        if output is not None:
            stdout_console().print(f"\nPlan written to {output}")
    for note in (cpu_precision_note(result), network_unused(cluster_spec)):
        if note:
            Console(stderr=True).print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


def search_pins(
    *,
    axis_pins: AxisPins = None,
    sharding: list[str] | None = None,
    compile_: bool | None = None,
    checkpointing: list[str] | None = None,
    float8: list[str] | None = None,
    async_tp: bool = False,
    pp_schedule: list[str] | None = None,
) -> SearchSpace:
    """The search space the pins leave (an unpinned axis searches all its values); `axis_pins`: the
    mesh axes' options as typed (api/cli/axis_pins.py)."""
    pins: dict[str, object] = {**pinned_degrees(axis_pins)}
    for option, values, known, field in (
        ("--sharding", sharding, SHARDINGS, "shardings"),
        ("--checkpointing", checkpointing, CHECKPOINT_MODES, "checkpointing"),
        ("--float8", float8, FLOAT8_CHOICES, "float8"),
        ("--pp-schedule", pp_schedule, PIPELINE_SCHEDULES, "pipeline_schedules"),
    ):
        if not values:
            continue
        chosen = choices(values)
        unknown = [v for v in chosen if v not in known] or ([] if chosen else ["(empty)"])
        if unknown:
            raise fail(f"{option}: {unknown[0]!r} is not one of {', '.join(known)}")
        pins[field] = list(dict.fromkeys(chosen))
    if compile_ is not None:
        pins["compile"] = [compile_]
    if async_tp:
        pins["async_tp"] = True
    return SearchSpace(**pins)


def mesh_line(config: ParallelConfig) -> str:
    """`dp_replicate 1 x dp_shard 64 x tp 8 (sequence + loss parallel)`: every degree named in
    words, beside the compact `dp64x1 tp8` of the configuration's label (pp and cp named when above 1),
    and what each axis above 1 splits (contract/mesh.py's registry)."""
    mesh = config.mesh
    split = mesh.splits()
    return mesh.degrees_text() + (f" ({'; '.join(split)})" if split else " (data parallelism only)")


def pipeline_line(pipeline: PipelineConfig, micro_batches: int) -> str:
    """`Interleaved1F1B, 2 stages per rank, blocks per stage 7/8/8/7, 16 micro-batches`."""
    blocks = "/".join(str(b) for b in pipeline.stage_blocks)
    return (f"{pipeline.schedule}, {pipeline.stages_per_rank} stage(s) per rank, blocks per stage {blocks} "
            f"(the first with the embeddings, the last with the head), {micro_batches} micro-batches")


def print_plan(p: Plan, console: Console, *, verbose: bool = False) -> None:
    """The plan as a person reads it: what was planned, the choice, why, and what else was close
    (the out-of-memory families folded into one row unless `verbose`)."""
    pred = p.prediction
    gpu = p.cluster.gpu_spec
    active = f", {quantity(p.model.active_params)} active" if p.model.active_params is not None else ""
    console.print(
        f"[bold]{p.model.name}[/] ({quantity(p.model.num_params)} params{active}) on "
        f"{p.cluster.num_nodes}x{p.cluster.gpus_per_node} {gpu.name} "
        f"({p.cluster.ranks()}{p.cluster.domains()}), "
        f"seq {p.training.seq_len}, {p.training.global_batch_tokens:,} tokens/step"
        + (f", network {network_bandwidth(p.cluster.inter_node_bandwidth_gbps)}"
           if p.cluster.inter_node_bandwidth_gbps is not None else "")
        + (f", {precision_label(p.training.precision, p.training.state_dtype)}"
           if p.training.state_dtype == "bfloat16" else "")
        + (f", calibration {p.calibration_id}" if p.calibration_id else ", uncalibrated")
    )
    console.print(f"Chosen: [bold green]{p.config.label()}[/]")
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_row("mesh", mesh_line(p.config))
    if p.config.pipeline is not None:
        summary.add_row("pipeline", pipeline_line(p.config.pipeline, p.config.grad_accum_steps))
        summary.add_row(
            "pipeline bubble",
            f"{duration(pred.pipeline_bubble_s)}/step waiting while the stages fill and drain; "
            f"{duration(pred.exposed_pipeline_p2p_s)}/step of stage-to-stage sends exposed",
        )
    summary.add_row("step time", duration(pred.step_time_s))
    summary.add_row(
        "tokens/s/GPU", f"{pred.tokens_per_s_per_gpu:,.0f}{within(pred.tokens_per_s_per_gpu_interval)}"
    )
    summary.add_row("MFU", f"{pred.mfu:.1%}")
    summary.add_row("peak memory", _peak_line(p))
    summary.add_row("exposed comm", f"{duration(pred.exposed_comm_s)}/step of {duration(pred.comm_s)}")
    for entry in exposed_comm_axes():
        if p.config.mesh.degree(entry.name) > 1:
            exposed = getattr(pred, entry.exposed_comm)
            summary.add_row(entry.spoken, f"{duration(exposed)}/step of it ({entry.exposed_comm_why})")
    if pred.tokens_per_s_per_gpu_interval is not None:
        # "80% interval": no wider than the other labels, so the rows stay where they were.
        summary.add_row("80% interval", interval_basis(p))
    console.print(summary)
    for warning in p.warnings:
        # Markup off: the message is the planner's text, with brackets of its own.
        console.print(f"warning: {in_cli_terms(warning.message)}", style="bold yellow", markup=False)

    breakdown = pred.memory_breakdown_gib
    memory = Table(title=f"Peak memory per GPU (at {breakdown.moment})", title_justify="left")
    memory.add_column("part")
    memory.add_column("GiB", justify="right")
    memory.add_column("share", justify="right")
    for name, term in MEMORY_TERMS.items():
        gib = getattr(breakdown, name)
        memory.add_row(term.label, f"{gib:.2f}", f"{gib / pred.peak_memory_gib:.0%}")
    console.print(memory)
    if pred.expert_memory_gib is not None:
        console.print(_expert_memory_table(pred.expert_memory_gib, pred.peak_memory_gib))
    if pred.memory_margin_reason:
        console.print(f"memory margin {pred.memory_margin:.0%}: {pred.memory_margin_reason}")

    alternatives = Table(title="Alternatives", title_justify="left")
    for column in ("configuration", "tokens/s/GPU", "vs chosen", "MFU", "peak GiB", "exposed comm"):
        alternatives.add_column(column, justify="left" if column == "configuration" else "right")
    for a in p.alternatives:
        alternatives.add_row(
            # Labelled from the configuration: a plan stored by an older version shows today's label.
            a.config.label(), f"{a.tokens_per_s_per_gpu:,.0f}{within(a.tokens_per_s_per_gpu_interval)}",
            f"{a.relative_throughput:.1%}", f"{a.mfu:.1%}",
            f"{a.peak_memory_gib:.1f}{within(a.peak_memory_gib_interval, decimals=1)}",
            duration(a.exposed_comm_s),
        )
    console.print(alternatives)

    rejected = Table(title="Why the other families lost", title_justify="left")
    rejected.add_column("family")
    rejected.add_column("reason")
    lost = summarize_rejected(p)
    for r in lost.every_family if verbose else lost.shown:
        rejected.add_row(r.family, r.reason)
    if lost.line and not verbose:
        rejected.add_row("out of memory", f"{lost.line} (--verbose lists each)")
    console.print(rejected)
    console.print(
        f"[dim]{p.search.candidates_evaluated} configurations evaluated, {p.search.candidates_fitting} fit; "
        f"plan {p.plan_hash[:12]}[/]"
    )


def _expert_memory_table(parts: ExpertMemory, peak_gib: float) -> Table:
    """The same peak split into the routed experts', the dispatch buffers' and the dense parts."""
    table = Table(title="Of it, by part of the model", title_justify="left")
    table.add_column("part")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    for name, label in EXPERT_MEMORY_LABELS.items():
        gib = getattr(parts, name)
        table.add_row(label, f"{gib:.2f}", f"{gib / peak_gib:.0%}")
    return table


def within(interval: PredictionInterval | None, *, decimals: int = 0) -> str:
    """` (7,031–8,938)`: a number's 80% interval after it; nothing for plans stored before schema 2.2."""
    return "" if interval is None else f" ({between(interval.low, interval.high, decimals=decimals)})"


def interval_basis(plan: Plan) -> str:
    """What the bracketed ranges are and which held-out runs they rest on."""
    pred = plan.prediction
    assert pred.tokens_per_s_per_gpu_interval is not None
    level = f"{pred.tokens_per_s_per_gpu_interval.level:.0%}"
    line = (f"in brackets: {level} of measured runs like this fell inside "
            f"(tokens/s: {pred.tokens_per_s_per_gpu_interval.basis}")
    if pred.peak_memory_gib_interval is not None:
        line += f"; memory: {pred.peak_memory_gib_interval.basis}"
    return line + ")"


def _peak_line(plan: Plan) -> str:
    """`51.7 GiB (47.7–56.0) of 78.6 usable (+24% margin: 64.1 GiB)`; plans stored before 1.1 lack the
    margin, before 2.2 the interval."""
    pred = plan.prediction
    peak = f"{pred.peak_memory_gib:.1f} GiB{within(pred.peak_memory_gib_interval, decimals=1)}"
    if pred.usable_memory_gib is None or pred.memory_margin is None:
        return f"{peak} of {plan.cluster.gpu_spec.memory_gib:.1f}"
    return (
        f"{peak} of {pred.usable_memory_gib:.1f} usable "
        f"(+{pred.memory_margin:.0%} margin: {pred.peak_memory_gib * (1 + pred.memory_margin):.1f} GiB)"
    )
