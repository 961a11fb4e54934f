"""Optimizer (AdamW or SGD with momentum), warmup + cosine schedule, gradient clipping on DTensors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
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


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm over all (sharded) gradients; returns the norm before clipping."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    params = [p for p in model.parameters() if p.grad is not None]
    # max_norm inf: measure only (the clip coefficient is then capped at 1).
    limit = max_norm if max_norm > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=grads[0].device.type == "cuda")
    # With DTensor gradients the norm is a replicated DTensor (its computation all-reduced shards).
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
