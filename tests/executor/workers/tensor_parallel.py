"""torchrun worker: a dp x tp Llama trains like one process, and its 2-D checkpoints resume.

    torchrun --nproc-per-node 4 tests/executor/workers/tensor_parallel.py --out result.json \
        --checkpoint-dir DIR --tp 2 --steps 4 CASE [CASE ...]

CASE is `engine:backend[:loss_chunks]`: `fsdp2:eager`, `simple_fsdp:eager`, `simple_fsdp:inductor`,
`simple_fsdp:aot_eager`. Every case is a full_shard plan over (dp_shard = world / tp) x tp ranks.
Each trains `--steps` optimizer steps with the runtime's own data sampling (by data-parallel rank),
`train_step` (clipping on) and AdamW, from weights initialised per parameter name; the reference
trains the same global batches in one process, unsharded. Rank 0 writes one record per case: the
per-step losses of both, the worst relative gradient error at step 1 (before any update), and for
`fsdp2:eager` the loss of the last step after resuming from a checkpoint of the step before it,
under FSDP2 and under eager SimpleFSDP (both hold the same DTensors on the combined mesh).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from executor.runtime.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from executor.runtime.data import BatchIndex, SyntheticTokens  # noqa: E402
from executor.runtime.distributed import build_mesh, data_parallel_rank, init_distributed  # noqa: E402
from executor.runtime.materialize import clean_name, materialize  # noqa: E402
from executor.runtime.models import build_model  # noqa: E402
from executor.runtime.optim import OptimizerSettings, build_optimizer, set_lr  # noqa: E402
from executor.runtime.parallelize import Overrides, Parallelized, parallelize  # noqa: E402
from executor.runtime.plan import RuntimePlan, parse_plan  # noqa: E402
from executor.runtime.step import train_step  # noqa: E402
from tests.executor.plan_factory import debug_plan  # noqa: E402

SEED = 7
LR = 2e-3
SETTINGS = OptimizerSettings(lr=LR, weight_decay=0.1, max_grad_norm=1.0)


def make_plan(*, world: int, tp: int, compiled: bool, loss_chunks: int) -> RuntimePlan:
    return parse_plan(
        debug_plan(
            sharding="full_shard",
            nodes=1,
            gpus_per_node=world,
            tp=tp,
            micro_batch_size=2,
            compile=compiled,
            bucket_mb=64.0 if compiled else 0.0,
            loss_chunks=loss_chunks,
        )
    )


def batches(plan: RuntimePlan, data: SyntheticTokens, step: int, dp_rank: int, dp_size: int) -> list:
    cfg = plan.config
    per_rank = cfg.micro_batch_size * plan.config.mesh.dp // dp_size  # the reference takes them all
    return [
        data.batch(BatchIndex(step, micro, dp_rank, dp_size, per_rank))
        for micro in range(cfg.grad_accum_steps)
    ]


def train(
    par: Parallelized,
    plan: RuntimePlan,
    *,
    steps: range,
    dp: tuple[int, int],
    optimizer: torch.optim.Optimizer | None = None,
    grads: dict[str, torch.Tensor] | None = None,
) -> tuple[list[float], torch.optim.Optimizer]:
    """Train `steps`; returns the global mean loss per step. With `grads`, fills it with the full
    gradients of the first step (before clipping and the update). `dp` is (data-parallel rank,
    size): (0, 1) for the single-process reference."""
    data = SyntheticTokens(vocab_size=plan.model.vocab_size, seq_len=plan.training.seq_len, seed=SEED)
    optimizer = optimizer or build_optimizer(par.module, SETTINGS, device=torch.device("cpu"))
    set_lr(optimizer, LR)
    losses = []
    for step in steps:

        def capture(first: bool = step == steps[0]) -> None:
            if grads is None or not first:
                return
            for name, p in par.module.named_parameters():
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[clean_name(name)] = grad.detach().clone()

        result = train_step(
            par,
            optimizer,
            iter(batches(plan, data, step, *dp)),
            grad_accum_steps=plan.config.grad_accum_steps,
            max_grad_norm=SETTINGS.max_grad_norm,
            loss_chunks=plan.config.loss_chunks,
            before_update=capture,
        )
        loss = result.loss_sum / plan.config.grad_accum_steps
        if dp[1] > 1:
            # As the trainer does: the ranks of a tp group hold equal losses, so the mean over
            # every rank is the mean over the data-parallel ranks.
            dist.all_reduce(loss)
            loss = loss / dist.get_world_size()
        losses.append(float(loss))
    return losses, optimizer


def reference(plan: RuntimePlan, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in this process alone: no sharding, no tensor parallelism."""
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    materialize(model, device=torch.device("cpu"), seed=SEED)
    par = Parallelized(
        module=model,
        forward=model,
        engine="fsdp2",
        compiled=False,
        compile_settings=None,
        checkpointed_blocks=0,
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
    )
    grads: dict[str, torch.Tensor] = {}
    losses, _ = train(par, plan, steps=range(1, steps + 1), dp=(0, 1), grads=grads)
    return losses, grads


def parallel(plan: RuntimePlan, mesh, overrides: Overrides) -> Parallelized:
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    par = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    materialize(par.module, device=torch.device("cpu"), seed=SEED)
    return par


def rel_err(grad: torch.Tensor, ref: torch.Tensor) -> float:
    return ((grad - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def run_case(case: str, *, world: int, tp: int, steps: int, cache: dict, ckpt_root: Path) -> dict:
    engine, backend, *rest = case.split(":")
    loss_chunks = int(rest[0]) if rest else 1
    compiled = backend != "eager"
    plan = make_plan(world=world, tp=tp, compiled=compiled, loss_chunks=loss_chunks)
    env = init_distributed(plan)
    if "mesh" not in cache:
        cache["mesh"] = build_mesh(plan, env)
    mesh = cache["mesh"]
    dp = data_parallel_rank(mesh)
    if loss_chunks not in cache:
        cache[loss_chunks] = reference(plan, steps)
    ref_losses, ref_grads = cache[loss_chunks]

    overrides = Overrides(engine=engine, compile=compiled, backend=backend if compiled else "inductor")
    t0 = time.perf_counter()
    par = parallel(plan, mesh, overrides)
    grads: dict[str, torch.Tensor] = {}
    losses, optimizer = train(par, plan, steps=range(1, steps), dp=dp, grads=grads)
    record: dict = {"case": case, "dp": dp, "notes": par.notes, "ref_losses": ref_losses}
    ckpt = ckpt_root / case.replace(":", "-")
    if engine == "fsdp2":
        save_checkpoint(ckpt, step=steps - 1, model=par.module, optimizer=optimizer, train_state={}, keep=1)
    last, _ = train(par, plan, steps=range(steps, steps + 1), dp=dp, optimizer=optimizer)
    record["losses"] = losses + last
    record["seconds"] = time.perf_counter() - t0
    record["grad_errors"] = {name: rel_err(grads[name], ref) for name, ref in ref_grads.items()}
    if engine == "fsdp2":
        resumed = {}
        for other in ("fsdp2", "simple_fsdp"):
            again = parallel(plan, mesh, Overrides(engine=other, compile=False))
            optimizer = build_optimizer(again.module, SETTINGS, device=torch.device("cpu"))
            load_checkpoint(ckpt / f"step-{steps - 1:08d}", model=again.module, optimizer=optimizer)
            resumed[other], _ = train(again, plan, steps=range(steps, steps + 1), dp=dp, optimizer=optimizer)
        record["resumed_last_loss"] = {k: v[0] for k, v in resumed.items()}
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    results: list[dict] = []
    cache: dict = {}
    for case in args.cases:
        record = run_case(
            case, world=world, tp=args.tp, steps=args.steps, cache=cache, ckpt_root=args.checkpoint_dir
        )
        results.append(record)
        if dist.get_rank() == 0:
            print(json.dumps(record), flush=True)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
