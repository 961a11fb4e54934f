"""torchrun worker: a context-parallel Llama (cp, with dp or tp) trains like one process, and its
checkpoints resume.

    torchrun --nproc-per-node N tests/executor/workers/context_parallel.py --out result.json \
        --checkpoint-dir DIR [--steps 4] CASE [CASE ...]

CASE is `cp,tp:sharding:engine:backend[:loss_chunks[:ac]]`, e.g. `2,1:full_shard:fsdp2:eager`,
`2,2:full_shard:fsdp2:eager` (cp 2 x tp 2), `2,1:full_shard:simple_fsdp:inductor:2`. Every case is a
plan over (world / (cp x tp) data-parallel ranks) x cp x tp ranks, the data-parallel ranks all
dp_shard (full_shard), all dp_replicate (no_shard), or for hybrid_shard a shard group on each of
2 "nodes" (8 ranks: dp_replicate 2 x dp_shard 2 x cp 2).

As `tensor_parallel.py` (whose helpers this reuses): each case trains `--steps` AdamW steps with the
runtime's data sampling (by data-parallel rank: the cp ranks of one read the same sequences),
`train_step` and gradient clipping, from weights initialised per parameter name; the reference
trains the same global batches in one process. Rank 0 writes one record per case: each rank's
(data-parallel rank, size), both runs' per-step losses, the relative step-1 gradient error per
parameter, for eager cases the untrained model's logits' error (a forward without targets), the
inductor cases' collectives, and for the first case's checkpoint the last step's loss again after
resuming under FSDP2, eager SimpleFSDP and unsharded in one process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import RuntimePlan, parse_plan  # noqa: E402
from executor.runtime.data import BatchIndex, SyntheticTokens  # noqa: E402
from executor.runtime.distributed import build_mesh, data_parallel_rank, exit_process, init_distributed  # noqa: E402
from executor.runtime.evaluate import _reshard  # noqa: E402
from executor.runtime.parallelize import Parallelized  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan  # noqa: E402
from tests.executor.workers.model_parallel_runs import (  # noqa: E402
    SEED,
    reference,
    rel_err,
    run_cases,
    trained_record,
    unsharded,
)

# llama-debug with 2 blocks: the same layers, half the graph to trace and compile on 2 cores.
MODEL = {**LLAMA_DEBUG, "num_layers": 2}
CHECKPOINTED_CASE = "2,1:full_shard:fsdp2:eager"


def make_plan(
    *, sharding: str, world: int, cp: int, tp: int, backend: str, loss_chunks: int, ac: str
) -> RuntimePlan:
    compiled = backend != "eager"
    nodes = 2 if sharding == "hybrid_shard" else 1  # a shard group per "node", replicas across
    document = debug_plan(
        sharding=sharding,
        nodes=nodes,
        gpus_per_node=world // nodes,
        cp=cp,
        tp=tp,
        micro_batch_size=2,
        compile=compiled,
        checkpointing=ac,
        bucket_mb=64.0 if compiled else 0.0,
        loss_chunks=loss_chunks,
        model=MODEL,
    )
    return parse_plan(document)


def first_logits_error(par: Parallelized, plan: RuntimePlan, dp: tuple[int, int]) -> float:
    """Relative error of the untrained model's logits (no targets: every rank gets the whole
    sequences' logits, gathered over cp in position order) against the one-process model's."""
    data = SyntheticTokens(vocab_size=plan.model.vocab_size, seq_len=plan.training.seq_len, seed=SEED)
    tokens = data.batch(BatchIndex(1, 0, dp[0], dp[1], plan.config.micro_batch_size))[:, :-1]
    with torch.no_grad():
        logits = par.forward(tokens)
        ref = unsharded(plan).forward(tokens)
    _reshard(par.module)  # as after evaluation: FSDP2's head unit stays gathered after a forward alone
    return rel_err(logits, ref)


def run_case(case: str, *, world: int, steps: int, cache: dict, checkpoint_dir: Path) -> dict:
    degrees, sharding, engine, backend, *rest = case.split(":")
    cp, tp = (int(d) for d in degrees.split(","))
    loss_chunks = int(rest[0]) if rest else 1
    ac = rest[1] if len(rest) > 1 else "none"
    plan = make_plan(
        sharding=sharding, world=world, cp=cp, tp=tp, backend=backend, loss_chunks=loss_chunks, ac=ac
    )
    env = init_distributed(plan)
    key = (plan.config.mesh.shape, sharding)
    if key not in cache:  # one set of process groups per mesh shape, reused across cases
        cache[key] = build_mesh(plan, env)
    mesh = cache[key]
    dp = data_parallel_rank(mesh)
    every_dp: list = [None] * world
    dist.all_gather_object(every_dp, dp)
    if ("reference", dp[1]) not in cache:  # the global batch: micro-batch x data-parallel ranks
        cache["reference", dp[1]] = reference(plan, steps)
    compiled = backend != "eager"
    checkpointed = case == CHECKPOINTED_CASE and world == 2

    def logits_error(par: Parallelized) -> dict[str, float | None]:
        return {"logits_err": None if compiled else first_logits_error(par, plan, dp)}

    return trained_record(
        case, plan, mesh, dp=dp, every_dp=every_dp, reference_run=cache["reference", dp[1]], engine=engine,
        backend=backend, steps=steps, checkpoint_dir=checkpoint_dir if checkpointed else None,
        probe=logits_error,
    )


def main() -> None:
    run_cases(run_case)

if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
