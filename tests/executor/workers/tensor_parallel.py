"""torchrun worker: a dp x tp Llama trains like one process, and its 2-D checkpoints resume.

    torchrun --nproc-per-node 4 tests/executor/workers/tensor_parallel.py --out result.json \
        --checkpoint-dir DIR [--tp 2] [--steps 4] CASE [CASE ...]

CASE is `sharding:engine:backend[:loss_chunks[:ac[:tied]]]`, e.g. `full_shard:fsdp2:eager`,
`no_shard:simple_fsdp:eager`, `full_shard:simple_fsdp:inductor:2` (backend `eager`: no
torch.compile; loss_chunks: token slices of the vocabulary-parallel loss; ac: the plan's activation
checkpointing mode; `tied`: the head shares the embedding's weight). Every case is a plan over
(world / tp data-parallel ranks) x tp ranks, the data-parallel ranks all dp_shard (full_shard) or
all dp_replicate (no_shard).

Each case trains `--steps` optimizer steps with the runtime's own data sampling (by data-parallel
rank), `train_step` (gradient clipping on) and AdamW, from weights initialised per parameter name;
the reference trains the same global batches in one process, unsharded, without tensor
parallelism. Rank 0 writes one record per case: each rank's (data-parallel rank, size), the
per-step losses of both, the relative gradient error per parameter at step 1 (before clipping and
the update); for inductor cases the collectives in the generated code (one call per bucket); and
for the case with a checkpoint (`full_shard:fsdp2:eager`) the loss of the last step again, after
resuming from the checkpoint of the step before it under FSDP2, under eager SimpleFSDP (the same
DTensors on the combined mesh) and unsharded in one process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import RuntimePlan, parse_plan  # noqa: E402
from executor.runtime.distributed import build_mesh, data_parallel_rank, exit_process, init_distributed  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan  # noqa: E402
from tests.executor.workers.model_parallel_runs import (  # noqa: E402
    reference,
    run_cases,
    trained_record,
)

# llama-debug with 2 blocks: the same layers, half the graph to trace and compile on 2 cores.
MODEL = {**LLAMA_DEBUG, "num_layers": 2}
CHECKPOINTED_CASE = "full_shard:fsdp2:eager"


def make_plan(
    *, sharding: str, world: int, tp: int, backend: str, loss_chunks: int, ac: str, tied: bool
) -> RuntimePlan:
    compiled = backend != "eager"
    document = debug_plan(
        sharding=sharding,
        nodes=1,
        gpus_per_node=world,
        tp=tp,
        micro_batch_size=2,
        compile=compiled,
        checkpointing=ac,
        bucket_mb=64.0 if compiled else 0.0,
        loss_chunks=loss_chunks,
        model={**MODEL, "tie_word_embeddings": tied},
    )
    # Compiled cases ask for async TP, as a GPU plan may: on CPU it must fall back to the plain
    # collectives (symmetric memory is CUDA's) and train the same.
    document["config"]["async_tp"] = compiled
    return parse_plan(document)


def run_case(case: str, *, world: int, tp: int, steps: int, cache: dict, checkpoint_dir: Path) -> dict:
    sharding, engine, backend, *rest = case.split(":")
    loss_chunks = int(rest[0]) if rest else 1
    ac = rest[1] if len(rest) > 1 else "none"
    tied = rest[2:] == ["tied"]
    plan = make_plan(
        sharding=sharding, world=world, tp=tp, backend=backend, loss_chunks=loss_chunks, ac=ac, tied=tied
    )
    env = init_distributed(plan)
    shape = (plan.config.mesh.dp_replicate, plan.config.mesh.dp_shard, tp)
    if shape not in cache:  # one set of process groups per mesh shape, reused across cases
        cache[shape] = build_mesh(plan, env)
    mesh = cache[shape]
    dp = data_parallel_rank(mesh)
    every_dp: list = [None] * world
    dist.all_gather_object(every_dp, dp)
    if ("reference", tied) not in cache:
        cache["reference", tied] = reference(plan, steps)
    checkpointed = case == CHECKPOINTED_CASE
    return trained_record(
        case, plan, mesh, dp=dp, every_dp=every_dp, reference_run=cache["reference", tied], engine=engine,
        backend=backend, steps=steps, checkpoint_dir=checkpoint_dir if checkpointed else None,
    )


def main() -> None:
    run_cases(run_case, tp=2)

if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
