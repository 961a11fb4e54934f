"""Pipeline parallelism's own terms: where the blocks go, the schedule's bubble, what a rank holds.

The rest of the cost model prices one pipeline rank as if it were a smaller model (its stages'
blocks, with the embeddings on the first stage and the head on the last: `stage_share` in
planner/cost/model_costs.py); this module adds what the schedule does around it:

- *stage split*: blocks per stage, balanced by time (the embeddings are cheap, the head and the
  loss cost several blocks, so the last stage gets fewer blocks);
- *bubble*: the time a rank waits while the pipeline fills and drains (closed form for the 1F1B
  schedules; torch's zero-bubble V order simulated, planner/pipeline_timeline.py);
- *in flight*: how many micro-batches' activations a rank holds at its peak (the first stage the
  most under 1F1B);
- *boundary tensors*: the hidden states a rank keeps for its stages' sends and receives.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from contract.parallel_config import PipelineConfig, PipelineSchedule
from planner.pipeline_timeline import ChunkTimes, simulate

__all__ = [
    "BoundaryTensors",
    "ChunkTimes",
    "balanced_stage_split",
    "boundary_tensors",
    "bubble_fraction",
    "bubble_seconds",
    "in_flight_chunks",
]


@functools.lru_cache(maxsize=1024)
def balanced_stage_split(
    num_blocks: int, stages: int, *, first_extra: float, last_extra: float
) -> tuple[int, ...]:
    """Blocks per stage (each at least one) so that the slowest stage is as fast as it can be, where
    the first stage also does `first_extra` and the last `last_extra` blocks' worth of work (the
    embeddings; the final norm, head and loss). Stages alike get counts that differ by at most one,
    the extra blocks going to the middle."""
    if stages > num_blocks:
        raise ValueError(f"{stages} stages need at least {stages} blocks, the model has {num_blocks}")
    if stages == 1:
        return (num_blocks,)

    def extra(s: int) -> float:
        return (first_extra if s == 0 else 0.0) + (last_extra if s == stages - 1 else 0.0)

    def counts(limit: float) -> tuple[int, ...] | None:
        # The most blocks each stage can take under `limit`; feasible when they hold every block.
        caps = [math.floor(limit - extra(s)) for s in range(stages)]
        if min(caps) < 1 or sum(caps) < num_blocks:
            return None
        split = [1] * stages
        remaining = num_blocks - stages
        # Fill the stages evenly, never above their caps: one block at a time to the least loaded.
        while remaining:
            s = min(
                (s for s in range(stages) if split[s] < caps[s]),
                key=lambda s: (split[s] + extra(s), abs(s - (stages - 1) / 2)),
            )
            split[s] += 1
            remaining -= 1
        return tuple(split)

    low = (num_blocks + first_extra + last_extra) / stages
    limit = math.ceil(low)
    while (split := counts(limit)) is None:
        limit += 1
    return split


def bubble_seconds(schedule: PipelineSchedule, *, pp: int, chunk: ChunkTimes, micro_batches: int) -> float:
    """The time the busiest rank waits per step while the pipeline fills and drains.

    1F1B and interleaved 1F1B wait pp - 1 chunks of forward and backward (a chunk is a stage's
    share: the rank's work divided by its stages, which is how interleaving cuts the bubble), once
    there are pp micro-batches. Zero-bubble V fills waits with weight gradients, but how much is left
    depends on how forward, input and weight gradients compare (at least the ramp of pp - 1 forwards
    the last rank waits for): its bubble is torch's order simulated (planner/pipeline_timeline.py),
    on at most 2 pp micro-batches, after which the V is full and every further one adds work, not
    waiting.
    """
    if pp <= 1:
        return 0.0
    if schedule == "ZBVZeroBubble":
        return _zero_bubble_v(pp, min(micro_batches, 2 * pp), chunk)
    return (pp - 1) * chunk.total


def _zero_bubble_v(pp: int, micro_batches: int, chunk: ChunkTimes) -> float:
    total = chunk.total
    if not total:
        return 0.0
    # The bubble scales with the chunk: simulate the shares, rounded so that a search reuses them.
    forward, input_grad = round(chunk.forward / total, 3), round(chunk.input_grad / total, 3)
    return total * _simulated_v_bubble(pp, micro_batches, forward, input_grad)


@functools.lru_cache(maxsize=4096)
def _simulated_v_bubble(pp: int, micro_batches: int, forward: float, input_grad: float) -> float:
    v = PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=2, stage_blocks=(1,) * (2 * pp))
    shares = ChunkTimes(forward, input_grad, max(0.0, 1.0 - forward - input_grad))
    return simulate(v, pp=pp, micro_batches=micro_batches, chunk=shares).bubble_s


def bubble_fraction(pipeline: PipelineConfig, *, pp: int, micro_batches: int, chunk: ChunkTimes) -> float:
    """The bubble over the busiest rank's compute per step (`micro_batches` x its stages' chunks)."""
    work = micro_batches * pipeline.stages_per_rank * chunk.total
    bubble = bubble_seconds(pipeline.schedule, pp=pp, chunk=chunk, micro_batches=micro_batches)
    return bubble / work if work else 0.0


def in_flight_chunks(pipeline: PipelineConfig, *, pp: int, rank: int, micro_batches: int) -> int:
    """Chunks (a micro-batch through one stage) whose activations pipeline rank `rank` holds at its
    peak: the forwards the schedule runs before that rank's first backward, plus the one whose
    backward it is.

    1F1B: rank r warms up with pp - 1 - r forwards (the first stage holds pp micro-batches);
    interleaved 1F1B (torch's schedule): (v - 1) x pp + 2 (pp - 1 - r) forwards of its v stages;
    ZBV (torch's schedule): every rank 2 pp chunks of its two stages once its warm-up reaches the
    second stage's first backward (the V balances memory across ranks: ZB-V keeps 1F1B's
    first-stage activation memory, pp micro-batches of a whole rank's work).
    """
    v = pipeline.stages_per_rank
    if pipeline.schedule == "1F1B":
        held = pp - rank
    elif pipeline.schedule == "Interleaved1F1B":
        held = (v - 1) * pp + 2 * (pp - 1 - rank) + 1
    else:
        held = 2 * pp
    return max(1, min(held, micro_batches * v))


@dataclass(frozen=True, slots=True)
class BoundaryTensors:
    """Hidden-state tensors of one micro-batch each (a stage's input or output: micro-batch x the
    rank's tokens x hidden) that a pipeline rank holds for its stages' point-to-point communication."""

    received: float
    """Receive buffers: allocated once by torch's stages and alive for the whole run, optimizer
    step included."""
    sent: float
    """Forward outputs sent on and kept until their micro-batch's backward (at the rank's peak)."""


def boundary_tensors(
    pipeline: PipelineConfig, *, pp: int, rank: int, micro_batches: int, chunks_in_flight: int
) -> BoundaryTensors:
    """What pipeline rank `rank` holds at the stage boundaries (torch.distributed.pipelining's
    stages, measured on gloo ranks by tests/executor/test_pipeline_memory.py).

    Every stage but the first allocates one receive buffer per micro-batch for the activations the
    stage before sends, every stage but the last one per micro-batch for the gradients the stage
    after sends back, once, before the first step. Every stage but the last keeps each forward's
    output (which the stage's own autograd graph does not hold) until that micro-batch's backward:
    one per chunk in flight, spread over the rank's stages.
    """
    stages = pipeline.stages_of(rank, pp)
    last = pipeline.num_stages - 1
    received = micro_batches * sum((s != 0) + (s != last) for s in stages)
    sent = chunks_in_flight * sum(s != last for s in stages) / len(stages)
    return BoundaryTensors(received=float(received), sent=sent)
