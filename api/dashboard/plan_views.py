"""What the plan pages show, computed from a stored plan: labelled rows, charts, and the compare table.

The stored document is read back through the planner's own `Plan` model
(`api.services.plan_documents.read_plan`), so every field is typed and a document this version cannot
read is caught in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.dashboard import charts
from api.dashboard import formatting as fmt
from api.db.models import PlanRow
from api.services import plan_compare
from api.services.plan_compare import Scalar
from contract.mesh import AXES, Axis, exposed_comm_axes
from contract.parallel_config import ParallelConfig
from contract.training_config import precision_label
from planner.cost.memory import MEMORY_TERMS
from planner.formatting import quantity
from planner.plan import (
    EXPERT_MEMORY_LABELS,
    Candidate,
    Plan,
    Prediction,
    PredictionInterval,
    TimelineSegment,
)

# Memory parts in the order they are stacked, with the words a person reads: the planner's own terms.
MEMORY_PARTS = {name: term.label for name, term in MEMORY_TERMS.items()}
MEMORY_COLORS = dict(zip(MEMORY_PARTS.values(), (*charts.PALETTE[:8], "#bbbbbb"), strict=True))

COMPUTE_FORWARD, COMPUTE_BACKWARD, OPTIMIZER = charts.PALETTE[0], charts.PALETTE[2], charts.PALETTE[3]
ALL_GATHER, REDUCE = charts.PALETTE[1], charts.PALETTE[4]
TIMELINE_LEGEND = (
    ("forward compute", COMPUTE_FORWARD),
    ("backward compute", COMPUTE_BACKWARD),
    ("optimizer", OPTIMIZER),
    ("all-gather", ALL_GATHER),
    ("reduce-scatter / all-reduce", REDUCE),
    ("exposed communication (compute waits)", charts.EXPOSED_COLOR),
)
LANE_COMPUTE, LANE_COMM = "compute", "communication"


@dataclass(frozen=True)
class Row:
    """One labelled value of a definition list."""

    label: str
    value: str
    hint: str = ""


def cluster_label(plan: Plan) -> str:
    """`18 × 4 × GB200 in scale-up domains of 72` where a domain spans nodes (`ClusterSpec.domains`)."""
    c = plan.cluster
    return f"{c.num_nodes} × {c.gpus_per_node} × {c.gpu}{c.domains()}"


def checkpointing_label(config: ParallelConfig) -> str:
    mode = config.checkpointing.mode
    if mode == "blocks":
        return f"blocks: the first {config.checkpointing.blocks} blocks recomputed, the rest not"
    if mode == "selective":
        return f"selective: every {config.checkpointing.every_k}th block recomputed" if (
            config.checkpointing.every_k > 1) else "selective: every block recomputed"
    return {"none": "none", "full": "full (every block recomputed)",
            "op_selective": "op-level selective (every other matmul saved)"}.get(mode, mode)


def sharding_label(config: ParallelConfig) -> str:
    mesh = config.mesh
    if config.sharding == "hybrid_shard":
        label = f"hybrid_shard: sharded over {mesh.dp_shard}, replicated × {mesh.dp_replicate}"
    else:
        label = {"full_shard": "full_shard (ZeRO-3)", "shard_grad_op": "shard_grad_op (ZeRO-2)",
                 "no_shard": "no_shard (replicated, DDP-like)"}.get(config.sharding, config.sharding)
    return label + (f"; tensor parallel × {mesh.tp}" if mesh.tp > 1 else "")


def mesh_row(config: ParallelConfig) -> Row:
    """The device mesh, every degree named (pp and cp when above 1), with what each axis above 1
    brings (contract/mesh.py's registry: every axis's `note`)."""
    mesh = config.mesh
    notes = [note for entry in AXES if (note := entry.noted(mesh))]
    if not notes:
        return Row("Device mesh", mesh.degrees_text("×"), f"{mesh.world_size} GPUs, data parallelism only")
    return Row("Device mesh", mesh.degrees_text("×"), f"{mesh.world_size} GPUs; " + "; ".join(notes))


def input_rows(row: PlanRow, plan: Plan) -> list[Row]:
    model, cluster, training = plan.model, plan.cluster, plan.training
    dims = (f"{model.num_layers} layers, hidden {model.hidden_size}, {model.num_heads} heads"
            if model.architecture != "layer_graph" else f"{len(model.layer_graph or [])} traced units")
    return [
        Row("Model", model.name, f"{model.architecture}, {quantity(model.num_params)} parameters, {dims}"),
        Row("Cluster", cluster_label(plan), f"{cluster.world_size} GPUs"),
        Row("GPU", cluster.gpu_spec.name, f"{cluster.gpu_spec.memory_gib:g} GiB, "
            f"{cluster.gpu_spec.peak_bf16_tflops:g} TFLOP/s bf16 peak"),
        Row("Sequence length", f"{training.seq_len:,} tokens"),
        Row("Global batch", f"{training.global_batch_tokens:,} tokens",
            f"{training.global_batch_sequences:,} sequences per optimizer step"),
        Row(
            "Precision / optimizer",
            f"{precision_label(training.precision, training.state_dtype)} / {training.optimizer}",
        ),
        Row("Calibration", calibration_words(row.calibration_id)),
    ]


def config_rows(config: ParallelConfig) -> list[Row]:
    buckets = (
        "one collective per wrap unit" if not (config.all_gather_bucket_mb or config.reduce_scatter_bucket_mb)
        else f"all-gather {config.all_gather_bucket_mb:g} MB, "
        f"reduce-scatter {config.reduce_scatter_bucket_mb:g} MB"
    )
    inductor = config.inductor
    knobs = [name for name, on in (
        ("bucket all-gathers", inductor.bucket_all_gathers),
        ("bucket reduce-scatters", inductor.bucket_reduce_scatters),
        ("reorder for compute/comm overlap", inductor.reorder_for_compute_comm_overlap),
    ) if on]
    return [
        Row("Sharding", sharding_label(config)),
        mesh_row(config),
        Row("Wrap units", f"{config.blocks_per_unit} block(s) per FSDP unit",
            "embeddings and the output head are units of their own"),
        Row("Communication buckets", buckets),
        Row("Reshard after forward", "yes" if config.reshard_after_forward else "no"),
        Row("Prefetch depth", f"{config.prefetch_depth} unit(s) ahead"),
        Row("Activation checkpointing", checkpointing_label(config)),
        Row("Micro-batching", f"{config.micro_batch_size} sequence(s) per micro-batch × "
            f"{config.grad_accum_steps} accumulation step(s)"),
        Row("Mixed precision", f"params {config.param_dtype}, reductions {config.reduce_dtype}"),
        Row("Float8 training", float8_words(config.float8),
            "the blocks' linear layers that pass the recipe's size filter; the output head stays "
            "in the compute precision" if config.float8 != "none" else ""),
        Row("Async tensor parallel", async_tp_words(config.async_tp)),
        Row("torch.compile", compile_words(config.compile)
            + (": " + (", ".join(knobs) or "default inductor") if config.compile else "")),
    ]


# How the plan page and the compare page both write a configuration's switches: one wording.
def float8_words(recipe: str) -> str:
    return "off" if recipe == "none" else f"{recipe} (torchao)"


def async_tp_words(on: bool) -> str:
    return "on (inductor micro-pipelined TP, CUDA symmetric memory)" if on else "off"


def compile_words(on: bool) -> str:
    return "on" if on else "off (eager FSDP2)"


def calibration_words(calibration_id: int | None) -> str:
    return f"profile {calibration_id}" if calibration_id else "none (catalog peaks)"


def prediction_rows(plan: Plan) -> list[Row]:
    p = plan.prediction
    capacity = plan.cluster.gpu_spec.memory_gib
    return [
        Row("Step time", fmt.duration(p.step_time_s)),
        Row("Throughput", f"{fmt.thousands(p.tokens_per_s_per_gpu)} tokens/s per GPU",
            f"{fmt.thousands(p.tokens_per_s)} tokens/s over the cluster"),
        Row("MFU", fmt.percent(p.mfu), "model FLOPs utilisation against the bf16 peak"),
        Row("Peak memory", fmt.gib(p.peak_memory_gib),
            f"{p.peak_memory_gib / capacity:.0%} of the GPU's {capacity:g} GiB, "
            f"at {p.memory_breakdown_gib.moment}"),
        *_interval_rows(p),
        *_margin_rows(p),
        Row("Compute", fmt.duration(p.compute_s), f"of which optimizer {fmt.duration(p.optimizer_s)}"),
        Row("Communication", fmt.duration(p.comm_s), "overlapped or not"),
        Row("Exposed communication", fmt.duration(p.exposed_comm_s),
            f"all-gather {fmt.duration(p.exposed_all_gather_s)}, "
            f"reduce-scatter {fmt.duration(p.exposed_reduce_scatter_s)}"
            + "".join(f", {entry.spoken} {fmt.duration(getattr(p, entry.exposed_comm))}"
                      for entry in _exposed_axes(plan))),
        *(_exposed_comm_row(plan, entry) for entry in _exposed_axes(plan)),
        Row("Search", f"{plan.search.candidates_evaluated:,} configurations evaluated",
            f"{plan.search.candidates_fitting:,} fit in memory"),
    ]


def _exposed_axes(plan: Plan) -> list[Axis]:
    """The axes above 1 whose exposed communication the plan states apart (`Axis.exposed_comm`)."""
    return [entry for entry in exposed_comm_axes() if plan.config.mesh.degree(entry.name) > 1]


def _exposed_comm_row(plan: Plan, entry: Axis) -> Row:
    p = plan.prediction
    exposed: float = getattr(p, entry.exposed_comm)
    detail = entry.exposed_comm_detail.format(degree=plan.config.mesh.degree(entry.name))
    return Row(
        f"{entry.what.capitalize()} communication", fmt.duration(exposed),
        f"per step, all exposed: {detail} ({exposed / p.step_time_s:.0%} of the step)",
    )


def _interval_rows(p: Prediction) -> list[Row]:
    """The 80% intervals of the throughput and the peak, with the runs they rest on (plans stored
    before schema 2.2 have none)."""
    rows = []
    for label, interval, unit, decimals in (
        ("Throughput interval", p.tokens_per_s_per_gpu_interval, "tokens/s per GPU", 0),
        ("Peak memory interval", p.peak_memory_gib_interval, "GiB", 1),
    ):
        if interval is not None:
            level = f"{interval.level:.0%}"
            rows.append(Row(f"{label} ({level})", f"{fmt.interval(interval, decimals)} {unit}",
                            f"{level} of measured runs like this fell inside: {interval.basis}"))
    return rows


def _margin_rows(p: Prediction) -> list[Row]:
    """Usable memory and the margin kept, with its reason (plans stored before schema 1.1 lack them)."""
    if p.usable_memory_gib is None or p.memory_margin is None:
        return []
    return [
        Row("Usable memory", fmt.gib(p.usable_memory_gib), "the GPU less the CUDA context and NCCL"),
        Row("Memory margin", fmt.percent(p.memory_margin),
            f"peak + margin = {fmt.gib(p.peak_memory_gib * (1 + p.memory_margin))}; "
            f"{p.memory_margin_reason or ''}"),
    ]


def memory_segments(plan: Plan) -> list[tuple[str, float]]:
    breakdown = plan.prediction.memory_breakdown_gib
    return [(label, getattr(breakdown, key)) for key, label in MEMORY_PARTS.items()]


@dataclass(frozen=True)
class MemoryPart:
    """One row of a mixture-of-experts plan's peak split by part of the model."""

    part: str
    gib: str
    share: str


def expert_memory_rows(plan: Plan) -> list[MemoryPart]:
    """The peak split into the routed experts', the dispatch buffers' and the dense parts' (the
    command line's second memory table); none for a dense model or a plan stored without the split."""
    p = plan.prediction
    parts = p.expert_memory_gib
    if parts is None:
        return []
    gib = {name: getattr(parts, name) for name in EXPERT_MEMORY_LABELS}
    return [
        MemoryPart(label, fmt.gib(gib[name]), fmt.percent(gib[name] / p.peak_memory_gib))
        for name, label in EXPERT_MEMORY_LABELS.items()
    ]


def memory_chart(plans: Sequence[tuple[str, Plan]], chart_id: str = "memory-chart") -> charts.Chart:
    """Stacked memory breakdown per plan, against the GPU capacity when the plans share one GPU."""
    capacities = {plan.cluster.gpu_spec.memory_gib for _, plan in plans}
    limit = None
    if len(capacities) == 1:
        capacity = capacities.pop()
        limit = charts.GuideLine(label=f"GPU capacity {capacity:g} GiB", x=capacity)
    return charts.stacked_bars(
        chart_id=chart_id, title="Peak memory per GPU by purpose",
        bars=[charts.Bar(label=label, segments=memory_segments(plan)) for label, plan in plans],
        x_label="GiB per GPU", colors=MEMORY_COLORS, limit=limit, value_format=fmt.gib,
    )


def _segment_color(stream: str, phase: str, label: str) -> str:
    if stream == "compute":
        return {"forward": COMPUTE_FORWARD, "backward": COMPUTE_BACKWARD}.get(phase, OPTIMIZER)
    return ALL_GATHER if "gather" in label else REDUCE


# Beyond this many segments (a 70B or 405B model's hundreds of units) single spans are a pixel or two
# wide and the chart turns into stripes: it is drawn per phase instead.
TIMELINE_DETAIL_LIMIT = 200
PHASES = ("forward", "backward", "optimizer")


def _is_wait(seg: TimelineSegment) -> bool:
    """A comm segment that is all waiting: compute stood still for its whole length."""
    return seg.exposed_s > 0 and seg.exposed_s >= (seg.end_s - seg.start_s) * 0.999


def timeline_per_phase(plan: Plan) -> bool:
    return len(plan.prediction.timeline) > TIMELINE_DETAIL_LIMIT


def timeline_chart(plan: Plan) -> charts.Chart:
    """One micro-batch on the compute and communication streams: every span for small plans, per
    phase when there are too many to see (`timeline_per_phase`)."""
    if timeline_per_phase(plan):
        return _phase_timeline(plan)
    return _detailed_timeline(plan)


def _phase_timeline(plan: Plan) -> charts.Chart:
    """Per phase, where it starts: on the compute lane its compute then the time compute waited for
    communication (red); on the communication lane its all-gathers then its reductions. Widths are
    the summed durations, so the picture keeps how long each part takes, not where each unit ran."""
    spans = []
    for phase in PHASES:
        segments = [seg for seg in plan.prediction.timeline if seg.phase == phase]
        if not segments:
            continue
        start = min(seg.start_s for seg in segments)
        compute = [seg for seg in segments if seg.stream == "compute"]
        waits = sum(seg.exposed_s for seg in segments if seg.stream == "comm")
        busy = sum(seg.end_s - seg.start_s for seg in compute)
        cursor = start
        if compute:
            spans.append(charts.Span(
                lane=LANE_COMPUTE, start=cursor, end=cursor + busy, label=f"{phase} {fmt.duration(busy)}",
                short_label=fmt.duration(busy),
                color=_segment_color("compute", phase, ""), css_class="phase",
                tooltip=f"{phase} compute: {len(compute)} span(s), {fmt.duration(busy)} in all",
            ))
            cursor += busy
        if waits > 0:
            spans.append(charts.Span(
                lane=LANE_COMPUTE, start=cursor, end=cursor + waits, color=charts.EXPOSED_COLOR,
                label=f"waits {fmt.duration(waits)}", short_label=fmt.duration(waits),
                css_class="exposed phase",
                tooltip=f"{phase}: compute waits {fmt.duration(waits)} for communication (exposed)",
            ))
        transfers = [seg for seg in segments if seg.stream == "comm" and not _is_wait(seg)]
        cursor = min((seg.start_s for seg in transfers), default=start)
        gathers = [seg for seg in transfers if "gather" in seg.label]
        reductions = [seg for seg in transfers if "gather" not in seg.label]
        for group, word, short in ((gathers, "all-gather", "all-gather"),
                                   (reductions, "reduce-scatter / all-reduce", "reduce")):
            if not group:
                continue
            busy = sum(seg.end_s - seg.start_s for seg in group)
            exposed = sum(seg.exposed_s for seg in group)
            spans.append(charts.Span(
                lane=LANE_COMM, start=cursor, end=cursor + busy, label=f"{short} {fmt.duration(busy)}",
                short_label=fmt.duration(busy),
                color=_segment_color("comm", phase, word), css_class="phase",
                tooltip=f"{phase} {word}: {len(group)} transfer(s), {fmt.duration(busy)} on the links"
                        + (f", {fmt.duration(exposed)} of it exposed" if exposed else ""),
            ))
            cursor += busy
    # charts.timeline draws a phase block at least 4 units wide (a tensor-parallel plan's waits of a few
    # ms in a step of tens of seconds would be a one-pixel stripe); narrower blocks go last, so that
    # the neighbour drawn after them never covers the width they were given.
    spans.sort(key=lambda s: s.start - s.end)
    present = {s.color for s in spans}
    return charts.timeline(
        chart_id="timeline-chart", title="Step timeline of one micro-batch, per phase",
        lanes=(LANE_COMPUTE, LANE_COMM), spans=spans,
        legend=[(name, color) for name, color in TIMELINE_LEGEND if color in present],
    )


def _detailed_timeline(plan: Plan) -> charts.Chart:
    """Every span. The planner records a wait as a comm segment whose `exposed_s` is the time compute
    stood still, so it is drawn where that idle time is: on the compute lane, in red. A transfer that
    is partly exposed is drawn on the communication lane too.
    """
    spans = []
    for seg in plan.prediction.timeline:
        duration = seg.end_s - seg.start_s
        tooltip = f"{seg.label} ({seg.phase}): {fmt.duration(seg.start_s)} → {fmt.duration(seg.end_s)}, " \
                  f"{fmt.duration(duration)}"
        if seg.exposed_s > 0:
            spans.append(charts.Span(
                lane=LANE_COMPUTE, start=seg.end_s - seg.exposed_s, end=seg.end_s, color=charts.EXPOSED_COLOR,
                tooltip=f"{tooltip}; compute waits {fmt.duration(seg.exposed_s)}", css_class="exposed",
            ))
            if _is_wait(seg):
                continue
        lane = LANE_COMPUTE if seg.stream == "compute" else LANE_COMM
        spans.append(charts.Span(lane=lane, start=seg.start_s, end=seg.end_s, tooltip=tooltip,
                              color=_segment_color(seg.stream, seg.phase, seg.label)))
    present = {s.color for s in spans}
    return charts.timeline(
        chart_id="timeline-chart", title="Step timeline of one micro-batch",
        lanes=(LANE_COMPUTE, LANE_COMM), spans=spans,
        legend=[(name, color) for name, color in TIMELINE_LEGEND if color in present],
    )


def _in_brackets(interval: PredictionInterval | None, *, decimals: int = 0) -> str:
    return f" ({interval.level:.0%}: {fmt.interval(interval, decimals)})" if interval else ""


def _candidate_point(c: Candidate) -> charts.Point:
    return charts.Point(
        x=c.peak_memory_gib, y=c.tokens_per_s_per_gpu,
        tooltip=f"{c.config.label()}: {fmt.thousands(c.tokens_per_s_per_gpu)} tokens/s/GPU"
                f"{_in_brackets(c.tokens_per_s_per_gpu_interval)}, {fmt.gib(c.peak_memory_gib)}"
                f"{_in_brackets(c.peak_memory_gib_interval, decimals=1)}, MFU {fmt.percent(c.mfu)}",
        x_range=c.peak_memory_gib_interval, y_range=c.tokens_per_s_per_gpu_interval,
    )


def tradeoff_chart(plan: Plan) -> charts.Chart:
    """Throughput against peak memory: alternatives, the Pareto front, and the chosen plan."""
    p = plan.prediction
    chosen = charts.Point(
        x=p.peak_memory_gib, y=p.tokens_per_s_per_gpu,
        tooltip=f"chosen: {plan.config.label()}: {fmt.thousands(p.tokens_per_s_per_gpu)} tokens/s/GPU"
                f"{_in_brackets(p.tokens_per_s_per_gpu_interval)}, {fmt.gib(p.peak_memory_gib)}"
                f"{_in_brackets(p.peak_memory_gib_interval, decimals=1)}",
        x_range=p.peak_memory_gib_interval, y_range=p.tokens_per_s_per_gpu_interval,
    )
    capacity = plan.cluster.gpu_spec.memory_gib
    peaks = [c.peak_memory_gib for c in (*plan.alternatives, *plan.pareto_front)] + [p.peak_memory_gib]
    # The capacity line only helps when the plans come near it; otherwise it squeezes them into a corner.
    near = capacity <= max(peaks) * 1.5
    guides = [charts.GuideLine(label=f"capacity {capacity:g} GiB", x=capacity)] if near else []
    return charts.xy_chart(
        chart_id="tradeoff-chart", title="Throughput vs peak memory",
        series=[
            charts.Series("alternatives", [_candidate_point(c) for c in plan.alternatives], charts.PALETTE[0],
                       css_class="alternative"),
            charts.Series("Pareto front", [_candidate_point(c) for c in plan.pareto_front], charts.PALETTE[1],
                       line=True, css_class="pareto"),
            charts.Series("chosen plan", [chosen], charts.HIGHLIGHT_COLOR, radius=8, css_class="chosen",
                          ring=True),
        ],
        x_label="peak memory per GPU (GiB)", y_label="tokens/s per GPU", guides=guides,
    )


@dataclass(frozen=True)
class CandidateRow:
    rank: str
    candidate: Candidate
    on_pareto_front: bool
    chosen: bool


def candidate_rows(plan: Plan) -> list[CandidateRow]:
    """The chosen configuration then the alternatives, each marked when it is on the Pareto front."""
    front = {c.config for c in plan.pareto_front}
    p = plan.prediction
    chosen = Candidate(
        label=plan.config.label(), config=plan.config, step_time_s=p.step_time_s,
        tokens_per_s_per_gpu=p.tokens_per_s_per_gpu, mfu=p.mfu, peak_memory_gib=p.peak_memory_gib,
        exposed_comm_s=p.exposed_comm_s, relative_throughput=1.0,
        tokens_per_s_per_gpu_interval=p.tokens_per_s_per_gpu_interval,
        peak_memory_gib_interval=p.peak_memory_gib_interval,
    )
    rows = [CandidateRow("chosen", chosen, plan.config in front, True)]
    rows += [CandidateRow(str(i), c, c.config in front, False) for i, c in enumerate(plan.alternatives, 1)]
    return rows


# --- compare -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRow:
    section: str
    label: str
    values: list[str]
    differs: bool
    best: set[int]
    """Columns holding the best value (numeric rows with a direction only, and only when they differ)."""


_SHARDING_WORDS = {"full_shard": "full_shard (ZeRO-3)", "shard_grad_op": "shard_grad_op (ZeRO-2)",
                   "hybrid_shard": "hybrid_shard (2-D mesh)", "no_shard": "no_shard (replicated, DDP-like)"}
_CHECKPOINTING_WORDS = {"none": "none", "selective": "selective (every k-th block)",
                        "op_selective": "op-level selective", "full": "full (every block)",
                        "blocks": "blocks (the first n blocks)"}


def _yes_no(value: Scalar) -> str:
    return "yes" if value else "no"


def _number(value: Scalar) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


# How the page writes each compared field's raw value (plan_compare.FIELDS decides what is compared).
_COMPARE_DISPLAY: dict[str, Callable[[Any], str]] = {
    "model.num_params": quantity,
    "training.seq_len": _number,
    "training.global_batch_tokens": _number,
    "calibration_id": calibration_words,
    "config.sharding": lambda v: _SHARDING_WORDS.get(v, v),
    "config.all_gather_bucket_mb": _number,
    "config.reduce_scatter_bucket_mb": _number,
    "config.reshard_after_forward": _yes_no,
    "config.checkpointing.mode": lambda v: _CHECKPOINTING_WORDS.get(v, v),
    "config.float8": float8_words,
    "config.async_tp": async_tp_words,
    "config.compile": compile_words,
    "prediction.step_time_s": fmt.duration,
    "prediction.tokens_per_s_per_gpu": fmt.thousands,
    "prediction.tokens_per_s": fmt.thousands,
    "prediction.mfu": fmt.percent,
    "prediction.peak_memory_gib": fmt.gib,
    "prediction.peak_memory_gib_interval": lambda v: f"{v} GiB",
    "network_assumed": lambda v: "not stated: priced as a range" if v else "stated (or one node)",
    "prediction.exposed_comm_s": fmt.duration,
    **{f"prediction.{entry.exposed_comm}": fmt.duration for entry in exposed_comm_axes()},
    **{f"config.mesh.{entry.name}": entry.compared for entry in AXES},
    # To the second: two plans made in the same minute differ here, and the row must show how.
    "created_at": lambda v: f"{datetime.fromisoformat(v):%Y-%m-%d %H:%M:%S} UTC",
    **{f"prediction.memory_breakdown_gib.{key}": fmt.gib for key in MEMORY_PARTS},
}


def compare_rows(plans: Sequence[tuple[PlanRow, Plan]]) -> list[CompareRow]:
    """The compare table: plan_compare's comparison, its values written for a person."""
    return [
        CompareRow(c.field.section, c.field.label, [_compare_value(c.field.key, v) for v in c.values],
                   c.differs, set(c.best))
        for c in plan_compare.compare(plans)
    ]


def _compare_value(key: str, value: Scalar) -> str:
    if value is None and key != "calibration_id":
        return "–"  # not applicable to this plan
    return _COMPARE_DISPLAY.get(key, str)(value)
