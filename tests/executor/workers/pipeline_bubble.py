"""torchrun worker: time a pipeline schedule's compute actions and its steps on CPU ranks, to
compare the bubble measured with the one `planner/cost/pipeline.py` prices.

    torchrun --nproc-per-node 2 tests/executor/workers/pipeline_bubble.py --out result.json \
        [--steps 4] SCHEDULE [SCHEDULE ...]

Each SCHEDULE (`1F1B`, `Interleaved1F1B`, `ZBVZeroBubble`) runs a pp 2 plan of a llama whose
stages are all compute: 4 blocks of hidden 512 (one block per stage, or two for 1F1B), a
256-word vocabulary so that the embeddings and the head cost little next to a block, one sequence
of 512 tokens per micro-batch, 4 micro-batches per step, eager FSDP2, fp32. Every rank wraps its stages'
compute actions (torch's `forward_one_chunk`, `backward_one_chunk` with its input-only variant,
`backward_weight_one_chunk`, and the gradient reduction after the last one) with a timer; a step
is timed from a barrier before the schedule to a barrier after it. Rank 0 writes, per schedule
and step, each rank's compute seconds by action and stage (`F0`: forward of stage 0, `B`: full
backward, `I`: input gradient, `W`: weight gradient, `R`: gradient reduction; `cpu`: the CPU
seconds of each; lists) and the step's wall seconds. No sleeps: the bubble is what the ranks
wait for each other's compute (a stage boundary's 1 MiB send takes 0.3-2 ms here, a chunk's
compute 0.2-0.5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import parse_plan  # noqa: E402
from executor.runtime.data import BatchIndex, SyntheticTokens  # noqa: E402
from executor.runtime.distributed import build_mesh, exit_process, init_distributed  # noqa: E402
from executor.runtime.parallelize import Overrides  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan  # noqa: E402
from tests.executor.workers.model_parallel_runs import SEED, parallel  # noqa: E402
from tests.executor.workers.pipeline_parallel import SPLITS  # noqa: E402

MODEL = {
    **LLAMA_DEBUG,
    "name": "llama-bubble",
    "vocab_size": 256,
    "hidden_size": 512,
    "num_heads": 8,
    "num_kv_heads": 8,
    "intermediate_size": 1536,
    "num_layers": 4,
}
MICRO_BATCHES = 4


ACTIONS = {
    "forward_one_chunk": "F",
    "backward_one_chunk": "B",  # "I" when the schedule asks for the input gradient only
    "backward_weight_one_chunk": "W",
    "perform_reduce_grad": "R",  # after the last micro-batch: compute, not waiting
}


def timed_actions(stage: Any, log: dict[str, list[float]]) -> None:
    """Wrap `stage`'s compute actions so that each call appends its seconds to `log[kind + stage
    index]`, e.g. `F0`, `I3`, and the CPU seconds the rank's thread got meanwhile to `log["cpu"]`
    (fewer than the seconds: another process had the core for a while)."""

    def wrap(name: str) -> None:
        original = getattr(stage, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            input_only = name == "backward_one_chunk" and not kwargs.get("full_backward", True)
            kind = "I" if input_only else ACTIONS[name]
            start, start_cpu = time.perf_counter(), time.thread_time()
            result = original(*args, **kwargs)
            log.setdefault(f"{kind}{stage.stage_index}", []).append(time.perf_counter() - start)
            log.setdefault("cpu", []).append(time.thread_time() - start_cpu)
            return result

        setattr(stage, name, timed)

    for name in ACTIONS:
        wrap(name)


def run_schedule(schedule: str, *, world: int, steps: int, cache: dict) -> list[dict]:
    document = debug_plan(
        gpus_per_node=world,
        seq_len=512,
        micro_batch_size=1,
        grad_accum_steps=MICRO_BATCHES,
        model=MODEL,
        name=MODEL["name"],
        pipeline=SPLITS[schedule],
    )
    plan = parse_plan(document)
    env = init_distributed(plan)
    if "mesh" not in cache:
        cache["mesh"] = build_mesh(plan, env)
    par = parallel(plan, cache["mesh"], Overrides(engine="fsdp2", compile=False))
    assert par.pipeline is not None
    data = SyntheticTokens(vocab_size=plan.model.vocab_size, seq_len=plan.training.seq_len, seed=SEED)
    records = []
    for step in range(1, steps + 1):
        log: dict[str, list[float]] = {}
        for stage in par.pipeline.stages:
            timed_actions(stage, log)
        batch = torch.cat([data.batch(BatchIndex(step, micro, 0, 1, 1)) for micro in range(MICRO_BATCHES)])
        dist.barrier()
        start = time.perf_counter()
        par.pipeline.step(batch)
        dist.barrier()
        wall = time.perf_counter() - start
        for stage in par.pipeline.stages:  # the next step wraps them again
            for name in ACTIONS:
                del stage.__dict__[name]
        for p in par.module.parameters():
            p.grad = None
        every: list = [None] * world
        dist.all_gather_object(every, log)
        records.append({"schedule": schedule, "step": step, "wall_s": wall, "actions": every})
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("schedules", nargs="+")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    cache: dict = {}
    results = []
    for schedule in args.schedules:
        results += run_schedule(schedule, world=world, steps=args.steps, cache=cache)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
