"""torchrun worker: a pipeline-parallel Llama (pp 2, alone or with dp, tp or cp) trains like one
process, its pipeline-split checkpoints resume, and its schedule's bubble can be timed.

    torchrun --nproc-per-node N tests/executor/workers/pipeline_parallel.py --out result.json \
        --checkpoint-dir DIR [--steps 4] CASE [CASE ...]

CASE is `schedule:engine:backend[:dp,tp[,cp][:gpt2]]`, e.g. `1F1B:fsdp2:eager`, `Interleaved1F1B:
simple_fsdp:inductor`, `1F1B:fsdp2:eager:2,1` (pp 2 x dp 2 on 4 ranks), `1F1B:simple_fsdp:eager:1,2`
(pp 2 x tp 2), `1F1B:fsdp2:eager:1,1,2` (pp 2 x cp 2: context parallelism inside each stage),
`ZBVZeroBubble:fsdp2:eager:1,1:gpt2`. Every case is a plan over pp 2 of the 4-block
llama-debug, or with `gpt2` of a 4-block GPT-2 whose head is tied to its embedding (1F1B: two
stages of 2 blocks; Interleaved1F1B and ZBVZeroBubble: four stages of 1 block, two per rank)
with 4 micro-batches (the plan's grad_accum_steps) of 2 sequences each.

As the other model-parallel workers (`model_parallel_runs`): each case trains `--steps` AdamW
steps with the runtime's `train_step` (the pipeline's schedule, gradient clipping over both
stages) beside a one-process reference; rank 0 writes one record per case with the per-step
losses of both, the relative step-1 gradient error of every parameter (each pipeline rank
compares its stages' parameters by the whole model's names; the ranks' errors are merged), each
rank's (data-parallel rank, size) and stages. The CHECKPOINTED_CASES also save a checkpoint and
resume it (pipeline-split under both engines, and whole in one process).
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
from tests.executor.workers.model_parallel_runs import reference, run_cases, trained_record  # noqa: E402

PP = 2
MICRO_BATCHES = 4
SPLITS = {
    "1F1B": {"schedule": "1F1B", "stages_per_rank": 1, "stage_blocks": [2, 2]},
    "Interleaved1F1B": {"schedule": "Interleaved1F1B", "stages_per_rank": 2, "stage_blocks": [1, 1, 1, 1]},
    "ZBVZeroBubble": {"schedule": "ZBVZeroBubble", "stages_per_rank": 2, "stage_blocks": [1, 1, 1, 1]},
}
CHECKPOINTED_CASES = ("1F1B:fsdp2:eager", "1F1B:fsdp2:eager:1,1:gpt2", "1F1B:fsdp2:eager:1,1,2")
GPT2_TIED = {**LLAMA_DEBUG, "name": "gpt2-tied-debug", "architecture": "gpt2", "num_kv_heads": 8,
             "intermediate_size": 1024, "tie_word_embeddings": True}


def make_plan(*, schedule: str, world: int, tp: int, cp: int, backend: str, model: dict) -> RuntimePlan:
    compiled = backend != "eager"
    document = debug_plan(
        model=model,
        name=model["name"],
        sharding="full_shard",
        gpus_per_node=world,
        tp=tp,
        cp=cp,
        micro_batch_size=2,
        grad_accum_steps=MICRO_BATCHES,
        compile=compiled,
        bucket_mb=64.0 if compiled else 0.0,
        pipeline=SPLITS[schedule],
    )
    return parse_plan(document)


def run_case(case: str, *, world: int, steps: int, cache: dict, checkpoint_dir: Path) -> dict:
    schedule, engine, backend, *rest = case.split(":")
    dp, tp, cp = (*(int(d) for d in rest[0].split(",")), 1)[:3] if rest else (1, 1, 1)
    model = GPT2_TIED if rest[1:] == ["gpt2"] else LLAMA_DEBUG
    plan = make_plan(schedule=schedule, world=world, tp=tp, cp=cp, backend=backend, model=model)
    assert plan.config.mesh.dp == dp, (case, plan.config.mesh)
    env = init_distributed(plan)
    key = plan.config.mesh.shape
    if key not in cache:  # one set of process groups per mesh shape, reused across cases
        cache[key] = build_mesh(plan, env)
    mesh = cache[key]
    dp_rank = data_parallel_rank(mesh)
    every_dp: list = [None] * world
    dist.all_gather_object(every_dp, dp_rank)
    if ("reference", dp, model["name"]) not in cache:
        cache["reference", dp, model["name"]] = reference(plan, steps)
    checkpointed = case in CHECKPOINTED_CASES and world == PP * dp * tp * cp
    record = trained_record(
        case, plan, mesh, dp=dp_rank, every_dp=every_dp, reference_run=cache["reference", dp, model["name"]],
        engine=engine, backend=backend, steps=steps, checkpoint_dir=checkpoint_dir if checkpointed else None,
    )
    # Every rank compared its own stages' parameters: merge them (a tp, cp or dp peer's are the same names).
    every_errors: list = [None] * world
    dist.all_gather_object(every_errors, record["grad_errors"])
    merged: dict[str, float] = {}
    for errors in every_errors:
        for name, err in errors.items():
            merged[name] = max(err, merged.get(name, 0.0))
    record["grad_errors"] = merged
    record["compared_per_rank"] = [sorted(errors) for errors in every_errors]
    return record


def main() -> None:
    run_cases(run_case)

if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
