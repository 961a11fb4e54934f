"""Optimizer (AdamW or SGD with momentum), warmup + cosine schedule, gradient clipping on DTensors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


@dataclass(frozen=True, slots=True)
class OptimizerSettings:
    """Optimizer hyper-parameters (command-line flags of the trainer)."""

    name: str = "adamw"
    """`adamw` or `sgd` (from the plan's training.optimizer)."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """The cosine decays to lr x this at the last step."""
    warmup_steps: int = 10
    """Linear warmup from lr / warmup_steps to lr."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (not on norms, biases)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    momentum: float = 0.9
    """SGD momentum."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (0 disables)."""


def build_optimizer(
    model: nn.Module, settings: OptimizerSettings, *, device: torch.device
) -> torch.optim.Optimizer:
    """The optimizer over `model`'s (sharded) parameters; decay only on >= 2-D parameters."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # foreach kernels batch the per-parameter updates on GPU; on CPU the loop is as fast.
    foreach = device.type == "cuda"
    if settings.name == "sgd":
        return torch.optim.SGD(groups, lr=settings.lr, momentum=settings.momentum, foreach=foreach)
    if settings.name == "adamw":
        return torch.optim.AdamW(groups, lr=settings.lr, betas=settings.betas, foreach=foreach)
    raise ValueError(f"unknown optimizer {settings.name!r}")


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for 1-based `step`: linear warmup, then cosine to min_ratio."""
    if warmup_steps > 0 and step <= warmup_steps:
        return step / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    # The lr is a function of the step alone (no scheduler state to checkpoint or drift).
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(
    model: nn.Module,
    max_norm: float,
    *,
    pipeline_group: dist.ProcessGroup | None = None,
    counted_elsewhere: tuple[nn.Parameter, ...] = (),
) -> float:
    """Clip the global gradient norm over all (sharded) gradients; returns the norm before clipping.

    With `pipeline_group` (pp > 1) `model` holds this rank's stages only: the norm is taken over
    every stage's gradients (each rank's squared norm summed over the pp group, less
    `counted_elsewhere`: a tied weight's second copy) and every rank scales its own by the same
    coefficient, as one process clipping the whole model would."""
    params = [p for p in model.parameters() if p.grad is not None]
    # max_norm inf: measure only (the clip coefficient is then capped at 1).
    limit = max_norm if max_norm > 0 else math.inf
    if pipeline_group is not None:
        skip = {id(p) for p in counted_elsewhere}
        counted = [p for p in params if id(p) not in skip]
        return _clip_over_stages(counted, params, limit, pipeline_group)
    if not params:
        return 0.0
    grads = [p.grad for p in params]
    norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=grads[0].device.type == "cuda")
    # With DTensor gradients the norm is a replicated DTensor (its computation all-reduced shards).
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def _clip_over_stages(
    counted: list[nn.Parameter], params: list[nn.Parameter], limit: float, group: dist.ProcessGroup
) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    norm_grads = [p.grad for p in counted if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    local = torch.nn.utils.get_total_norm(norm_grads) if norm_grads else torch.zeros((), device=device)
    if isinstance(local, DTensor):
        local = local.full_tensor()
    squared = local.float().square()
    dist.all_reduce(squared, group=group)  # every rank of the pipeline joins, gradients or not
    norm = float(squared.sqrt())
    coefficient = min(1.0, limit / (norm + 1e-6))  # torch's clip_grad_norm_ coefficient
    if coefficient < 1.0:
        for grad in grads:
            grad.mul_(coefficient)
    return norm
