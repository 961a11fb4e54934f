"""Held-out loss: the model's mean cross-entropy over fixed sequences of the eval split.

Every evaluation reads the same sequences (`TokenSource.eval_batch`): `batches` eval batches of the
plan's global batch each (micro-batches x accumulation x data-parallel ranks, so the set does not
depend on how the ranks split it), through the same parallel forward as training, without
gradients. One all-reduce gives every rank the same mean.

A compiled model evaluates through the graph its training steps run: grad mode on, no backward, the
loss detached (its saved activations go with it, as a training forward's would before backward).
Under `torch.no_grad()` or `eval()` torch.compile compiles a second, forward-only graph in the middle
of the run, at the first evaluation, while the other ranks wait in its collectives (30-65 s at
llama-debug's size on a loaded machine); the training graph holds nothing the plan did not price for
a training step. (The heap corruption CPU runs died of around evaluations was gloo's two worker threads
running all-gathers side by side, not this compile: `GLOO_WORKER_THREADS` in distributed.py.)
Eager models evaluate without gradients (they compile nothing), and so do pipelines, through their
schedule's forward-only pass.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from executor.runtime.data import BatchIndex, TokenSource
from executor.runtime.parallelize import Parallelized
from executor.runtime.step import batch_loss


def evaluate(
    par: Parallelized,
    data: TokenSource,
    *,
    batches: int,
    dp_rank: int,
    dp_size: int,
    micro_batch_size: int,
    grad_accum_steps: int,
    loss_chunks: int,
    device: torch.device,
) -> float:
    """Mean loss over `batches` eval batches (collective: every rank calls it)."""
    module = par.module
    was_training = module.training
    training_graph = par.compiled and par.pipeline is None
    if not training_graph:
        module.eval()  # compiled: the training graph, whose guards hold the training flag too
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    count = 0
    try:
        with contextlib.nullcontext() if training_graph else torch.no_grad():
            for b in range(1, batches + 1):
                micro_batches = [
                    data.eval_batch(
                        BatchIndex(b, micro, dp_rank, dp_size, micro_batch_size), batches=batches
                    ).to(device, non_blocking=True)
                    for micro in range(grad_accum_steps)
                ]
                if par.pipeline is not None:
                    # The schedule's forward-only pass; the loss lands on the last stage's ranks.
                    loss_sum += par.pipeline.eval_loss(torch.cat(micro_batches))
                    count += grad_accum_steps if par.pipeline.holds_last else 0
                    continue
                for batch in micro_batches:
                    loss_sum += batch_loss(par, batch, loss_chunks=loss_chunks).detach().float()
                    count += 1
    finally:
        module.train(was_training)
        # Under a pipeline each stage is an FSDP root of its own (`module` holds no root).
        for root in [stage.submod for stage in par.pipeline.stages] if par.pipeline is not None else [module]:
            _reshard(root)
    # Every micro-batch holds as many tokens: the mean of their means is the mean. The ranks of a
    # cp x tp group hold the same losses (context parallelism returns its group's mean), so the
    # mean over all ranks is the mean over data-parallel ranks (under a pipeline: the ranks of the
    # last stage, the only ones that count micro-batches).
    stats = torch.stack([loss_sum, torch.tensor(float(count), device=device)])
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()


def _reshard(module: nn.Module) -> None:
    """FSDP2 keeps a unit's parameters gathered after a forward without backward when it does not
    reshard after forward (shard_grad_op, no_shard): free them, and forget the forward order the
    eval forwards recorded, so the next training step starts as it would have without evaluation."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - every supported torch has FSDP2
        return
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        return  # SimpleFSDP: the parametrization gathers per use, nothing stays behind
    root = units[0]
    if hasattr(root, "reset_iter_state"):  # torch >= 2.13: reshards every unit, clears the order
        root.reset_iter_state()
        return
    for unit in units:
        unit.reshard()
