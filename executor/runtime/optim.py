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
    if not params and pipeline_group is None:
        return 0.0
    skip = {id(p) for p in counted_elsewhere}
    grads = [p.grad for p in params]
    device = grads[0].device if grads else torch.device("cpu")
    squared = _squared_norm([p.grad for p in params if id(p) not in skip], device=device)
    if pipeline_group is not None:
        dist.all_reduce(squared, group=pipeline_group)  # every rank of the pipeline joins, gradients or not
    norm = float(squared.sqrt())
    # max_norm inf: measure only (the coefficient is then capped at 1); torch's clip_grad_norm_ one.
    coefficient = min(1.0, (max_norm if max_norm > 0 else math.inf) / (norm + 1e-6))
    if coefficient < 1.0:
        for grad in grads:
            grad.mul_(coefficient)
    return norm


def _squared_norm(grads: list[torch.Tensor], *, device: torch.device) -> torch.Tensor:
    """The squared 2-norm of all `grads` (fp32). DTensor gradients are grouped by their mesh (expert
    parallelism's experts live on another mesh than the dense parameters), each group's norm
    all-reduced over its own shards."""
    groups: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    squared = torch.zeros((), device=device, dtype=torch.float32)
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squared = squared + norm.float().square()
    return squared
