"""What the model-parallel workers share (tensor_parallel.py, context_parallel.py,
pipeline_parallel.py): training a parallelized model the way the trainer does, the same training in
one process for reference, and the command line that runs their cases."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._inductor.utils import run_and_get_code
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from contract.plan_document import RuntimePlan
from executor.runtime.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from executor.runtime.data import BatchIndex, SyntheticTokens
from executor.runtime.materialize import clean_name, materialize
from executor.runtime.models import build_model
from executor.runtime.optim import OptimizerSettings, build_optimizer, set_lr
from executor.runtime.parallelize import Overrides, Parallelized, parallelize
from executor.runtime.step import train_step
from tests.executor.workers.parity import count_collectives, record_cases

SEED = 7
SETTINGS = OptimizerSettings(lr=5e-4, weight_decay=0.1, max_grad_norm=1.0)
CPU = torch.device("cpu")


def train(
    par: Parallelized,
    plan: RuntimePlan,
    *,
    steps: range,
    dp: tuple[int, int],
    optimizer: torch.optim.Optimizer,
    grads: dict[str, torch.Tensor] | None = None,
) -> list[float]:
    """Train `steps` (1-based); returns the global mean loss of each. `dp` is (data-parallel rank,
    size), (0, 1) for the reference, which then reads the whole global batch. With `grads`, fills
    it with the full gradients of the first step."""
    cfg = plan.config
    data = SyntheticTokens(vocab_size=plan.model.vocab_size, seq_len=plan.training.seq_len, seed=SEED)
    per_rank = cfg.micro_batch_size * cfg.mesh.dp // dp[1]
    set_lr(optimizer, SETTINGS.lr)
    losses = []
    for step in steps:

        def capture(first: bool = step == steps[0]) -> None:
            if grads is None or not first:
                return
            for name, p in par.module.named_parameters():
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[clean_name(name)] = grad.detach().clone()

        micro_batches = [
            data.batch(BatchIndex(step, micro, dp[0], dp[1], per_rank))
            for micro in range(cfg.grad_accum_steps)
        ]
        result = train_step(
            par,
            optimizer,
            iter(micro_batches),
            grad_accum_steps=cfg.grad_accum_steps,
            max_grad_norm=SETTINGS.max_grad_norm,
            loss_chunks=cfg.loss_chunks,
            before_update=capture,
        )
        loss = result.loss_sum / cfg.grad_accum_steps
        if dp[1] > 1 or par.pipeline is not None:
            # As the trainer does: the ranks of a cp x tp group hold equal losses (context
            # parallelism returns its group's mean), so the mean over every rank is the mean over
            # the data-parallel ranks; under a pipeline only the last stage's ranks hold one.
            dist.all_reduce(loss)
            loss = loss / (dist.get_world_size() // cfg.mesh.pp)
        losses.append(float(loss))
    return losses


def unsharded(plan: RuntimePlan) -> Parallelized:
    """The model in this process alone: no sharding, no context or tensor parallelism."""
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    materialize(model, device=CPU, seed=SEED)
    return Parallelized(
        module=model,
        forward=model,
        engine="fsdp2",
        compiled=False,
        compile_settings=None,
        checkpointed_blocks=0,
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
    )


def reference(plan: RuntimePlan, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in this process alone (each rank runs it: it is small)."""
    par = unsharded(plan)
    grads: dict[str, torch.Tensor] = {}
    optimizer = build_optimizer(par.module, SETTINGS, device=CPU)
    losses = train(par, plan, steps=range(1, steps + 1), dp=(0, 1), optimizer=optimizer, grads=grads)
    return losses, grads


def parallel(plan: RuntimePlan, mesh: DeviceMesh, overrides: Overrides) -> Parallelized:
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    par = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    materialize(par.module, device=CPU, seed=SEED)
    return par


def rel_err(grad: torch.Tensor, ref: torch.Tensor) -> float:
    return ((grad - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def resumed_last_losses(
    plan: RuntimePlan, mesh: DeviceMesh, dp: tuple[int, int], checkpoint_dir: Path, steps: int
) -> dict[str, float]:
    """The last step's loss again, resumed from the checkpoint of the step before: under both
    engines (the same layout), and unsharded in one process (DCP reassembles the global tensors, which
    only works if the saved shards say truthfully where in the global tensor they lie)."""
    resumed = {}
    for other in ("fsdp2", "simple_fsdp", "unsharded"):
        if other == "unsharded":
            again, other_dp = unsharded(plan), (0, 1)
        else:
            again, other_dp = parallel(plan, mesh, Overrides(engine=other, compile=False)), dp
        optimizer = build_optimizer(again.module, SETTINGS, device=CPU)
        load_checkpoint(checkpoint_path(checkpoint_dir, steps - 1), model=again.module, optimizer=optimizer)
        last = range(steps, steps + 1)
        resumed[other] = train(again, plan, steps=last, dp=other_dp, optimizer=optimizer)[0]
    return resumed


def trained_record(
    case: str, plan: RuntimePlan, mesh: DeviceMesh, *, dp: tuple[int, int], every_dp: list,
    reference_run: tuple[list[float], dict[str, torch.Tensor]], engine: str, backend: str, steps: int,
    checkpoint_dir: Path | None = None, probe: Callable[[Parallelized], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train `case`'s parallelized model `steps` steps beside its one-process `reference_run`: its
    per-step losses, step-1 gradient errors, the collectives of inductor's code (backend `inductor`),
    what `probe` measures of the untrained model, and with `checkpoint_dir` the last step resumed from
    the checkpoint of the step before."""
    ref_losses, ref_grads = reference_run
    compiled = backend != "eager"
    overrides = Overrides(engine=engine, compile=compiled, backend=backend if compiled else "inductor")
    t0 = time.perf_counter()
    par = parallel(plan, mesh, overrides)
    measured = probe(par) if probe is not None else {}
    optimizer = build_optimizer(par.module, SETTINGS, device=CPU)
    grads: dict[str, torch.Tensor] = {}

    def first_steps() -> list[float]:
        return train(par, plan, steps=range(1, steps), dp=dp, optimizer=optimizer, grads=grads)

    collectives = None
    if backend == "inductor":
        losses, codes = run_and_get_code(first_steps)
        collectives = count_collectives(codes)
    else:
        losses = first_steps()
    if checkpoint_dir is not None:
        save_checkpoint(
            checkpoint_dir, step=steps - 1, model=par.module, optimizer=optimizer, train_state={}, keep=1
        )
    losses += train(par, plan, steps=range(steps, steps + 1), dp=dp, optimizer=optimizer)
    record: dict[str, Any] = {
        "case": case,
        "dp": every_dp,
        "notes": par.notes,
        "losses": losses,
        "ref_losses": ref_losses,
        # A pipeline rank holds its stages' parameters only (the worker merges the ranks' errors).
        "grad_errors": {name: rel_err(grads[name], ref) for name, ref in ref_grads.items() if name in grads},
        "seconds": time.perf_counter() - t0,
        "collectives": collectives,
        **measured,
    }
    if checkpoint_dir is not None:
        record["resumed_last_loss"] = resumed_last_losses(plan, mesh, dp, checkpoint_dir, steps)
    return record


def run_cases(run_case: Callable[..., dict[str, Any]], **options: int) -> None:
    """A worker's command line: `--out`, `--checkpoint-dir`, `--steps` and the cases (plus an integer
    option per `options`, with its default), each case run by `run_case(case, world=..., steps=...,
    cache=..., checkpoint_dir=..., **options)`; rank 0 prints each record and writes them all."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4)
    for name, default in options.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    options_given = {name: getattr(args, name) for name in options}
    record_cases(
        args.cases,
        args.out,
        lambda case, cache: run_case(
            case, world=world, steps=args.steps, cache=cache, checkpoint_dir=args.checkpoint_dir,
            **options_given,
        ),
    )
