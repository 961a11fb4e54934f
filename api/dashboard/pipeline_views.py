"""The plan page's Pipeline section (plans with pp > 1): the stages, and the schedule's timeline.

The stages come from the plan's `ParallelConfig.pipeline` (blocks per stage, the stage-to-rank
mapping); the timeline from `planner.pipeline_timeline.simulate` with the plan's chunk durations,
drawn as an SVG by the template (`_pipeline.html`): one row per pipeline rank, one box per forward,
backward, input gradient or weight gradient of a micro-batch through a stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.dashboard import charts
from api.dashboard import formatting as fmt
from api.dashboard.plan_views import Row
from contract.parallel_config import PipelineConfig
from planner.cost.pipeline import ChunkTimes
from planner.pipeline_timeline import ACTION_WORDS, UNIT_CHUNK, ActionKind, PipelineTimeline, simulate
from planner.plan import Plan

SCHEDULE_WORDS = {
    "1F1B": "1F1B: one stage per rank; after a warm-up of forwards, one forward then one backward",
    "Interleaved1F1B": "interleaved 1F1B: several stages per rank, looped (stage s on rank s mod pp), "
                       "which cuts the bubble by the stages per rank",
    "ZBVZeroBubble": "zero-bubble V: two stages per rank in a V (rank r holds stages r and 2pp − 1 − r); "
                     "backward split into the input gradient and the weight gradient, which fills the "
                     "bubbles",
}
KIND_COLORS: dict[ActionKind, str] = {
    "F": charts.PALETTE[0], "B": charts.PALETTE[2], "I": charts.PALETTE[5], "W": charts.PALETTE[1],
}
MAX_DRAWN_ACTIONS = 1200
"""Beyond this many boxes the timeline is drawn with fewer micro-batches (whole rounds of pp): the
steady state repeats, and the bubble stays what it is."""
# SVG geometry, in the viewBox's units (the figure scales to the page's width).
WIDTH, LEFT, ROW, GAP, AXIS = 1000.0, 64.0, 26.0, 6.0, 26.0


@dataclass(frozen=True)
class StageRow:
    stage: int
    rank: int
    blocks: str
    """Global block indices, e.g. `0–7` (or `3` for one block)."""
    count: int
    extras: str
    """What the stage runs beside its blocks: the embeddings (first), the head and loss (last)."""


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    width: float
    fill: str
    opacity: float
    """Later local stages of a rank are drawn lighter (one rank holds several under interleaving / V)."""
    label: str
    """The micro-batch number, when the box is wide enough for it."""
    ink: str
    tooltip: str
    kind: str


@dataclass(frozen=True)
class TimelineFigure:
    width: float
    height: float
    rows: list[tuple[str, float]]
    """(label, y of the row's middle)."""
    boxes: list[Box]
    ticks: list[tuple[float, str]]
    legend: list[tuple[str, str]]
    drawn_micro_batches: int
    micro_batches: int
    bubble_s: float
    makespan_s: float
    unit_durations: bool
    orders: list[tuple[int, str]]
    """Per rank, its actions in order as text (`F0.0 F0.1 B0.0 ...`): the figure's words."""

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.makespan_s if self.makespan_s else 0.0


def stage_rows(pipeline: PipelineConfig, pp: int) -> list[StageRow]:
    ranks = pipeline.stage_ranks(pp)
    last = pipeline.num_stages - 1
    rows = []
    for stage, (first, count) in enumerate(zip(pipeline.first_blocks(), pipeline.stage_blocks, strict=True)):
        blocks = f"{first}" if count == 1 else f"{first}–{first + count - 1}"
        extras = " and ".join(what for what, on in (
            ("embeddings", stage == 0), ("final norm, head and loss", stage == last)) if on)
        rows.append(StageRow(stage, ranks[stage], blocks, count, extras))
    return rows


def summary_rows(plan: Plan, pipeline: PipelineConfig, figure: TimelineFigure) -> list[Row]:
    pp = plan.config.mesh.pp
    simulated = f"{fmt.percent(figure.bubble_fraction)} of the drawn step"
    simulated += " (unit durations)" if figure.unit_durations else f": {fmt.duration(figure.bubble_s)} of " \
        f"{fmt.duration(figure.makespan_s)}"
    p = plan.prediction
    return [
        Row("Schedule", pipeline.label(), SCHEDULE_WORDS.get(pipeline.schedule, "")),
        Row("Stages", f"{pipeline.num_stages} = pp {pp} × {pipeline.stages_per_rank} per rank",
            f"{plan.config.mesh.stage_ranks} GPU(s) per stage (its data-, context- and tensor-parallel "
            "ranks)"),
        Row("Blocks per stage", " / ".join(str(b) for b in pipeline.stage_blocks),
            "the first stage also runs the embeddings, the last the final norm, the head and the loss"),
        Row("Micro-batches", f"{plan.config.grad_accum_steps} per step",
            "the schedule's micro-batches are the accumulation steps"),
        Row("Bubble", f"{fmt.duration(p.pipeline_bubble_s)} per step (predicted)",
            "the time the busiest pipeline rank waits while the pipeline fills and drains; the timeline "
            f"below, simulated: {simulated}"),
        Row("Stage-to-stage sends", f"{fmt.duration(p.exposed_pipeline_p2p_s)} per step exposed",
            "activations forward and their gradients back between neighbouring stages, on the critical "
            "path (in the exposed communication)"),
    ]


def chunk_times(plan: Plan, pipeline: PipelineConfig) -> ChunkTimes | None:
    """One micro-batch through one stage on the busiest rank, from the prediction's timeline (its
    forward and backward compute over the rank's stages); the backward split evenly between the input
    and the weight gradient. None when the timeline has no compute to read."""
    compute = [seg for seg in plan.prediction.timeline if seg.stream == "compute"]
    forward = sum(seg.end_s - seg.start_s for seg in compute if seg.phase == "forward")
    backward = sum(seg.end_s - seg.start_s for seg in compute if seg.phase == "backward")
    if forward <= 0 or backward <= 0:
        return None
    v = pipeline.stages_per_rank
    return ChunkTimes(forward=forward / v, input_grad=backward / v / 2, weight_grad=backward / v / 2)


def _drawn_micro_batches(pipeline: PipelineConfig, pp: int, micro_batches: int) -> int:
    per_micro_batch = pp * pipeline.stages_per_rank * (3 if pipeline.schedule == "ZBVZeroBubble" else 2)
    if micro_batches * per_micro_batch <= MAX_DRAWN_ACTIONS:
        return micro_batches
    return max(pp, MAX_DRAWN_ACTIONS // per_micro_batch // pp * pp)


def timeline_figure(plan: Plan, pipeline: PipelineConfig) -> TimelineFigure:
    pp, micro_batches = plan.config.mesh.pp, plan.config.grad_accum_steps
    chunk = chunk_times(plan, pipeline)
    drawn = _drawn_micro_batches(pipeline, pp, micro_batches)
    timeline = simulate(pipeline, pp=pp, micro_batches=drawn, chunk=chunk or UNIT_CHUNK)
    return _figure(timeline, pipeline, micro_batches=micro_batches, unit=chunk is None)


def _figure(timeline: PipelineTimeline, pipeline: PipelineConfig, *, micro_batches: int,
            unit: bool) -> TimelineFigure:
    pp, span = timeline.pp, timeline.makespan or 1.0
    scale = (WIDTH - LEFT - 8) / span
    local = {stage: pipeline.stages_of(rank, pp).index(stage)
             for rank in range(pp) for stage in pipeline.stages_of(rank, pp)}
    boxes = []
    for placed in timeline.actions:
        a = placed.action
        width = (placed.end - placed.start) * scale
        label = str(a.micro_batch)
        color = KIND_COLORS[a.kind]
        when = "" if unit else f", {fmt.duration(placed.start)} → {fmt.duration(placed.end)}"
        boxes.append(Box(
            x=LEFT + placed.start * scale, y=AXIS + placed.rank * (ROW + GAP), width=width, fill=color,
            opacity=1.0 - 0.4 * local[a.stage] / max(1, pipeline.stages_per_rank - 1),
            label=label if width >= 7 * len(label) + 4 else "", ink=charts.ink_on(color),
            tooltip=f"rank {placed.rank}, stage {a.stage}: {ACTION_WORDS[a.kind]} of micro-batch "
                    f"{a.micro_batch}{when}",
            kind=ACTION_WORDS[a.kind],
        ))
    ticks = [(LEFT + t * scale, fmt.duration(t) if not unit else f"{t:g}")
             for t in charts.nice_ticks(0.0, span, 6) if 0 <= t <= span]
    kinds = {placed.action.kind for placed in timeline.actions}
    orders = [(rank, " ".join(f"{p.action.kind}{p.action.stage}.{p.action.micro_batch}"
                              for p in timeline.of_rank(rank))) for rank in range(pp)]
    return TimelineFigure(
        width=WIDTH, height=AXIS + pp * (ROW + GAP) + 4,
        rows=[(f"rank {rank}", AXIS + rank * (ROW + GAP) + ROW / 2) for rank in range(pp)],
        boxes=boxes, ticks=ticks,
        legend=[(ACTION_WORDS[k], KIND_COLORS[k]) for k in ("F", "B", "I", "W") if k in kinds],
        drawn_micro_batches=timeline.micro_batches, micro_batches=micro_batches,
        bubble_s=timeline.bubble_s, makespan_s=timeline.makespan, unit_durations=unit, orders=orders,
    )


@dataclass(frozen=True)
class PipelineSection:
    """What the Pipeline section shows."""

    pipeline: PipelineConfig
    summary: list[Row]
    stages: list[StageRow]
    figure: TimelineFigure


def section(plan: Plan) -> PipelineSection | None:
    """The plan's Pipeline section (None without a pipeline: pp 1)."""
    pipeline = plan.config.pipeline
    if pipeline is None:
        return None
    figure = timeline_figure(plan, pipeline)
    return PipelineSection(pipeline, summary_rows(plan, pipeline, figure),
                           stage_rows(pipeline, plan.config.mesh.pp), figure)
