"""The pipeline schedule simulator (planner/pipeline_timeline.py): every action once, dependencies kept,
and the simulated idle against the cost model's bubble (planner.cost.pipeline.bubble_seconds).

ZB-V's simulated bubble is recorded, not matched: with torch's order it is at least the forward ramp
((pp - 1) forwards: the last pipeline rank cannot start before micro-batch 0 has gone through the
stages before it), where the cost model's formula, (pp - 1)(F + I - 2W), reaches zero.
"""

from __future__ import annotations

import itertools

import pytest

from contract.parallel_config import PipelineConfig
from planner.cost.pipeline import ChunkTimes, bubble_seconds, in_flight_chunks
from planner.pipeline_timeline import UNIT_CHUNK, Action, ScheduleError, rank_orders, simulate

CHUNKS = (UNIT_CHUNK, ChunkTimes(1.0, 1.5, 0.5), ChunkTimes(0.3, 0.4, 0.35))


def pipeline(schedule: str, pp: int, v: int = 1) -> PipelineConfig:
    v = 2 if schedule == "ZBVZeroBubble" else v
    return PipelineConfig(
        schedule=schedule, stages_per_rank=v, stage_blocks=(1,) * (pp * v)  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("schedule", "v"), [("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 4)])
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_the_looped_schedules_idle_what_the_cost_model_prices(schedule: str, v: int, pp: int) -> None:
    for rounds, chunk in itertools.product((1, 2, 3), CHUNKS):
        timeline = simulate(pipeline(schedule, pp, v), pp=pp, micro_batches=rounds * pp, chunk=chunk)
        expected = bubble_seconds(schedule, pp=pp, chunk=chunk, micro_batches=rounds * pp)  # type: ignore[arg-type]
        assert timeline.bubble_s == pytest.approx(expected), (rounds, chunk)
        # Every rank does the same work, so every rank waits the bubble.
        assert timeline.idle == pytest.approx((expected,) * pp)
    # 1F1B needs no whole rounds.
    if schedule == "1F1B":
        odd = simulate(pipeline(schedule, pp), pp=pp, micro_batches=2 * pp + 1)
        priced = bubble_seconds("1F1B", pp=pp, chunk=UNIT_CHUNK, micro_batches=2 * pp + 1)
        assert odd.bubble_s == pytest.approx(priced)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_zero_bubble_v_is_priced_as_torchs_order_runs(pp: int) -> None:
    zbv = pipeline("ZBVZeroBubble", pp)
    for chunk in CHUNKS:
        # From 2pp micro-batches the V is full: more add work, not waiting (the cost model simulates
        # at most 2pp of them).
        full = simulate(zbv, pp=pp, micro_batches=2 * pp, chunk=chunk).bubble_s
        for m in (2 * pp, 3 * pp, 4 * pp):
            timeline = simulate(zbv, pp=pp, micro_batches=m, chunk=chunk)
            assert timeline.bubble_s == pytest.approx(full)
            assert bubble_seconds("ZBVZeroBubble", pp=pp, chunk=chunk, micro_batches=m) == pytest.approx(
                timeline.bubble_s, rel=2e-3  # the shares are rounded so that a search reuses them
            )
            # Never under the ramp of forwards the last rank waits for.
            assert timeline.bubble_s >= (pp - 1) * chunk.forward - 1e-9
    unit = simulate(zbv, pp=pp, micro_batches=4 * pp)
    assert unit.bubble_s == pytest.approx(pp - 1)  # the ramp
    # Fewer micro-batches than the V holds (torch drops the actions of those that do not exist).
    assert simulate(zbv, pp=pp, micro_batches=pp).bubble_s == pytest.approx(2 * (pp - 1))
    few = bubble_seconds("ZBVZeroBubble", pp=pp, chunk=UNIT_CHUNK, micro_batches=pp)
    assert few == pytest.approx(2 * (pp - 1), rel=2e-3)


@pytest.mark.parametrize(("schedule", "v"), [("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 3),
                                             ("ZBVZeroBubble", 2)])
def test_every_action_runs_once_on_its_stage_rank_after_its_inputs(schedule: str, v: int) -> None:
    pp, m = 4, 8
    config = pipeline(schedule, pp, v)
    stage_rank = config.stage_ranks(pp)
    split = schedule == "ZBVZeroBubble"
    timeline = simulate(config, pp=pp, micro_batches=m, chunk=ChunkTimes(1.0, 1.2, 0.7))
    ends = {}
    for placed in timeline.actions:
        a = placed.action
        assert stage_rank[a.stage] == placed.rank, a
        key = (a.kind, a.stage, a.micro_batch)
        assert key not in ends, f"{key} runs twice"
        ends[key] = placed
    kinds = ("F", "I", "W") if split else ("F", "B")
    assert set(ends) == set(itertools.product(kinds, range(pp * config.stages_per_rank), range(m)))
    last = pp * config.stages_per_rank - 1
    backward = "I" if split else "B"
    for (kind, stage, i), placed in ends.items():
        if kind == "F" and stage > 0:
            assert placed.start >= ends["F", stage - 1, i].end
        if kind == backward:
            before = ends["F", stage, i] if stage == last else ends[backward, stage + 1, i]
            assert placed.start >= before.end and placed.start >= ends["F", stage, i].end
        if kind == "W":
            assert placed.start >= ends["I", stage, i].end
    # A rank runs one action at a time.
    for rank in range(pp):
        spans = sorted((p.start, p.end) for p in timeline.of_rank(rank))
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(spans))


def test_interleaved_warms_up_as_torch_does() -> None:
    """(v - 1) x pp + 2 (pp - 1 - rank) forwards before the first backward (one round of pp)."""
    pp, v = 4, 2
    for rank, order in enumerate(rank_orders(pipeline("Interleaved1F1B", pp, v), pp=pp, micro_batches=8)):
        warmup = next(i for i, a in enumerate(order) if a.kind == "B")
        assert warmup == (v - 1) * pp + 2 * (pp - 1 - rank) + 1  # the steady state's first forward too
        assert order[warmup].stage == (v - 1) * pp + rank  # the rank's last stage goes back first


def test_too_few_micro_batches_are_refused() -> None:
    with pytest.raises(ScheduleError, match="at least 4 micro-batches"):
        rank_orders(pipeline("1F1B", 4), pp=4, micro_batches=3)


def held_chunks(order: tuple[Action, ...]) -> int:
    """The most chunks whose activations a rank holds: forwards run whose backward (ZB-V: whose weight
    gradient, the last to read them) has not."""
    held = peak = 0
    for action in order:
        held += {"F": 1, "B": -1, "W": -1}.get(action.kind, 0)
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(("schedule", "v"), [("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 4),
                                             ("ZBVZeroBubble", 2)])
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_the_activations_in_flight_are_what_the_memory_model_holds(schedule: str, v: int, pp: int) -> None:
    """planner.cost.pipeline.in_flight_chunks against the simulated orders: equal, except ZB-V with
    fewer micro-batches than its V (2pp - 1), where the formula holds more than torch's order does."""
    config = pipeline(schedule, pp, v)
    for m in (pp, 2 * pp, 4 * pp):
        for rank, order in enumerate(rank_orders(config, pp=pp, micro_batches=m)):
            held = held_chunks(order)
            priced = in_flight_chunks(config, pp=pp, rank=rank, micro_batches=m)
            if schedule == "ZBVZeroBubble" and m < 2 * pp - 1:
                assert held <= priced, (m, rank)
            else:
                assert held == priced, (m, rank)
