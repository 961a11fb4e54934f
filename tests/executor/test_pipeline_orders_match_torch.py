"""The planner's schedule simulator writes each pipeline rank's actions in the order torch runs them:
checked against torch.distributed.pipelining's own per-rank orders (the planner re-derives them so
that it never imports torch)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contract.parallel_config import PipelineConfig
from planner.pipeline_timeline import rank_orders

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

# torch's computation types for the planner's action kinds.
KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def torch_order(schedule_class: type, rank: int, **attributes: object) -> list[tuple[str, int, int]]:
    """torch's `_calculate_single_rank_operations` for one rank, on the attributes its constructor sets
    (building real stages needs a process group), idle slots dropped."""
    fake = SimpleNamespace(**attributes)
    actions = schedule_class._calculate_single_rank_operations(fake, rank)
    return [
        (KINDS[a.computation_type.name], a.stage_index, a.microbatch_index) for a in actions if a is not None
    ]


def ours(config: PipelineConfig, pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    return [(a.kind, a.stage, a.micro_batch) for a in rank_orders(config, pp=pp, micro_batches=m)[rank]]


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 4), (4, 2, 12), (8, 4, 16)])
def test_interleaved_1f1b(pp: int, v: int, m: int) -> None:
    config = PipelineConfig(schedule="Interleaved1F1B", stages_per_rank=v, stage_blocks=(1,) * (pp * v))
    rounds = max(1, m // pp)
    for rank in range(pp):
        expected = torch_order(schedules.ScheduleInterleaved1F1B, rank, n_local_stages=v, pp_group_size=pp,
                               _n_microbatches=m, microbatches_per_round=m // rounds)
        assert ours(config, pp, m, rank) == expected, rank


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (2, 5), (4, 4), (4, 7), (4, 12), (8, 16)])
def test_zero_bubble_v(pp: int, m: int) -> None:
    config = PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=2, stage_blocks=(1,) * (2 * pp))
    for rank in range(pp):
        expected = torch_order(schedules.ScheduleZBVZeroBubble, rank, pp_group_size=pp, _n_microbatches=m,
                               num_stages=2 * pp)
        assert ours(config, pp, m, rank) == expected, rank
