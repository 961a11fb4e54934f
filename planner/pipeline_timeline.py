"""A pipeline schedule, simulated: each pipeline rank's actions in torch's order, placed in time.

`rank_orders` writes, per pipeline rank, the order in which torch.distributed.pipelining runs its
forwards and backwards (1F1B, interleaved 1F1B, ZB-V: re-derived here from the schedules' rules, not
imported: the planner never imports torch). `simulate` then places every action as early as its rank
and its inputs allow: a stage's forward of micro-batch i after the previous stage's forward of i, its
backward after the next stage's backward of i (the last stage's after its own forward), a weight
gradient after its input gradient. Point-to-point sends take no time here; each action takes the
chunk's time (`planner.cost.pipeline.ChunkTimes`: the plan's prediction, or unit durations).

The result is what the plan page draws (one row per pipeline rank), and its idle time is the
schedule's bubble, which tests compare with `planner.cost.pipeline.bubble_seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contract.parallel_config import PipelineConfig


@dataclass(frozen=True, slots=True)
class ChunkTimes:
    """Seconds of one micro-batch through one stage (a chunk) on the busiest rank."""

    forward: float
    input_grad: float
    """Backward's gradient w.r.t. the stage's input (with any recompute): on the critical path."""
    weight_grad: float
    """Backward's gradient w.r.t. the weights: zero-bubble schedules run it later, in the bubbles."""

    @property
    def total(self) -> float:
        return self.forward + self.input_grad + self.weight_grad


ActionKind = Literal["F", "B", "I", "W"]
"""F: forward; B: the whole backward (1F1B, interleaved); I: backward's input gradient and W its
weight gradient (ZB-V runs them apart, W later, in what would be bubbles)."""
ACTION_WORDS: dict[ActionKind, str] = {
    "F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient",
}
UNIT_CHUNK = ChunkTimes(forward=1.0, input_grad=1.0, weight_grad=1.0)
"""Unit durations: a forward, an input gradient and a weight gradient alike (backward = 2 forwards)."""


class ScheduleError(ValueError):
    """A schedule that cannot run as asked (too few micro-batches, or an order that deadlocks)."""


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    stage: int
    micro_batch: int


@dataclass(frozen=True, slots=True)
class PlacedAction:
    action: Action
    rank: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class PipelineTimeline:
    """Every action of one optimizer step on every pipeline rank, in time."""

    pp: int
    micro_batches: int
    actions: tuple[PlacedAction, ...]
    """In rank order, then time."""
    makespan: float
    """When the last rank finishes its last action."""
    busy: tuple[float, ...]
    """Per pipeline rank, the time it computes."""

    @property
    def idle(self) -> tuple[float, ...]:
        """Per pipeline rank, the time it waits within the step."""
        return tuple(self.makespan - busy for busy in self.busy)

    @property
    def bubble_s(self) -> float:
        """How much longer the step is than the busiest rank's work: the schedule's bubble."""
        return self.makespan - max(self.busy)

    def of_rank(self, rank: int) -> tuple[PlacedAction, ...]:
        return tuple(a for a in self.actions if a.rank == rank)


def rank_orders(pipeline: PipelineConfig, *, pp: int, micro_batches: int) -> tuple[tuple[Action, ...], ...]:
    """Per pipeline rank, its actions in the order torch's schedule runs them."""
    if micro_batches < pp:
        raise ScheduleError(f"{pp} stages need at least {pp} micro-batches, got {micro_batches}")
    if pipeline.schedule == "1F1B":
        return tuple(_one_f_one_b(rank, pp, micro_batches) for rank in range(pp))
    if pipeline.schedule == "Interleaved1F1B":
        return tuple(_interleaved(rank, pp, pipeline.stages_per_rank, micro_batches) for rank in range(pp))
    return tuple(_zero_bubble_v(rank, pp, micro_batches) for rank in range(pp))


def _one_f_one_b(rank: int, pp: int, m: int) -> tuple[Action, ...]:
    # torch's Schedule1F1B: pp - rank forwards, then a backward and a forward in turn, then the rest
    # of the backwards (the same as a warm-up of pp - 1 - rank forwards, then one forward one backward).
    warmup = min(m, pp - rank)
    order = [Action("F", rank, i) for i in range(warmup)]
    for i in range(m):
        order.append(Action("B", rank, i))
        if warmup + i < m:
            order.append(Action("F", rank, warmup + i))
    return tuple(order)


def _interleaved(rank: int, pp: int, v: int, m: int) -> tuple[Action, ...]:
    # torch's ScheduleInterleaved1F1B: micro-batches go through the rank's stages in rounds of
    # `per_round` (pp when it divides the micro-batches); a warm-up of (v - 1) x per_round forwards,
    # two more per hop from the last rank, then one forward and one backward, then the backwards.
    rounds = max(1, m // pp)
    if m % rounds:
        raise ScheduleError(f"Interleaved1F1B needs micro-batches in whole rounds of {m // rounds}; got {m}")
    per_round = m // rounds
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    steps = m * v

    def forward_stage(step: int) -> int:
        return (step // per_round) % v * pp + rank

    def backward_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * pp + rank

    forwards: dict[int, int] = {}
    backwards: dict[int, int] = {}

    def next_of(counts: dict[int, int], stage: int) -> int:
        counts[stage] = counts.get(stage, 0) + 1
        return counts[stage] - 1

    order = []
    for step in range(steps + warmup):
        if step < steps:
            stage = forward_stage(step)
            order.append(Action("F", stage, next_of(forwards, stage)))
        if step >= warmup:
            stage = backward_stage(step)
            order.append(Action("B", stage, next_of(backwards, stage)))
    return tuple(order)


def _zero_bubble_v(rank: int, pp: int, m: int) -> tuple[Action, ...]:
    # torch's ScheduleZBVZeroBubble: rank r holds stage r (the V's way down) and 2pp - 1 - r (its way
    # back). Warm-up: 2(pp - r) - 1 forwards of the first, r pairs of forwards of both, then pp - r
    # rounds of the second stage's forward, input gradient and weight gradient; steady state: a round
    # of both stages; cool-down: input gradients first, weight gradients after. torch plans at least
    # 2pp - 1 micro-batches and drops the actions of those that do not exist.
    n = max(2 * pp - 1, m)
    down, up = rank, 2 * pp - 1 - rank
    count = {"F0": 0, "F1": 0, "B0": 0, "B1": 0}
    order: list[Action] = []

    def run(kind: ActionKind, stage: int, key: str | None) -> None:
        index = count[key] if key else 0
        order.append(Action(kind, stage, index))
        if key:
            count[key] += 1

    def input_and_weight(stage: int, key: str) -> None:
        order.append(Action("I", stage, count[key]))
        order.append(Action("W", stage, count[key]))
        count[key] += 1

    for _ in range(2 * (pp - rank) - 1):
        run("F", down, "F0")
    for _ in range(rank):
        run("F", up, "F1")
        run("F", down, "F0")
    for _ in range(pp - rank):
        run("F", up, "F1")
        input_and_weight(up, "B1")
    while count["F1"] < count["F0"] or count["F0"] < n:
        if count["F0"] < n:
            run("F", down, "F0")
        input_and_weight(down, "B0")
        run("F", up, "F1")
        input_and_weight(up, "B1")
    weights = {"B0": count["B0"], "B1": count["B1"]}
    for _ in range(rank):
        run("I", down, "B0")
        run("I", up, "B1")
    for _ in range(pp - rank):
        run("I", down, "B0")
        order.append(Action("W", down, weights["B0"]))
        weights["B0"] += 1
    order += [Action("W", up, i) for i in range(weights["B1"], count["B1"])]
    order += [Action("W", down, i) for i in range(weights["B0"], count["B0"])]
    return tuple(a for a in order if a.micro_batch < m)


def _duration(kind: ActionKind, chunk: ChunkTimes) -> float:
    return {
        "F": chunk.forward, "B": chunk.input_grad + chunk.weight_grad,
        "I": chunk.input_grad, "W": chunk.weight_grad,
    }[kind]


def _dependency(action: Action, last_stage: int) -> tuple[ActionKind, int, int] | None:
    """The action whose end this one waits for (on its rank or a neighbour's), if any."""
    kind, stage, i = action.kind, action.stage, action.micro_batch
    if kind == "F":
        return ("F", stage - 1, i) if stage > 0 else None
    if kind == "W":
        return ("I", stage, i)
    if stage == last_stage:
        return ("F", stage, i)
    return (kind, stage + 1, i)


def simulate(
    pipeline: PipelineConfig, *, pp: int, micro_batches: int, chunk: ChunkTimes = UNIT_CHUNK
) -> PipelineTimeline:
    """The schedule placed in time: every action as early as its rank's previous action and its
    input allow (a backward's input is the next stage's backward of the micro-batch; for the
    schedules that split it, the input gradient's)."""
    orders = rank_orders(pipeline, pp=pp, micro_batches=micro_batches)
    last_stage = pp * pipeline.stages_per_rank - 1
    ends: dict[tuple[ActionKind, int, int], float] = {}
    placed: list[list[PlacedAction]] = [[] for _ in range(pp)]
    free = [0.0] * pp
    position = [0] * pp
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            while position[rank] < len(order):
                action = order[position[rank]]
                needed = _dependency(action, last_stage)
                if needed is not None and needed not in ends:
                    break
                start = max(free[rank], ends[needed] if needed is not None else 0.0)
                end = start + _duration(action.kind, chunk)
                ends[(action.kind, action.stage, action.micro_batch)] = end
                placed[rank].append(PlacedAction(action, rank, start, end))
                free[rank] = end
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: order[position[r]] for r, order in enumerate(orders) if position[r] < len(order)}
            raise ScheduleError(f"the {pipeline.schedule} order deadlocks: ranks wait on {stuck}")
    busy = tuple(sum(a.end - a.start for a in actions) for actions in placed)
    return PipelineTimeline(
        pp=pp, micro_batches=micro_batches, actions=tuple(a for actions in placed for a in actions),
        makespan=max(free), busy=busy,
    )
