"""One optimizer step: forward and backward over the micro-batches, gradient clipping, update.

The trainer runs it every step and the calibration profiler times it, so what calibration measures
of a whole step is exactly what training does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from executor.runtime.oom import PhaseTracker
from executor.runtime.optim import clip_grad_norm
from executor.runtime.parallelize import Parallelized


@dataclass(frozen=True, slots=True)
class StepResult:
    loss_sum: torch.Tensor
    """Sum of the micro-batch losses (on the device; not yet averaged over ranks)."""
    grad_norm: float
    """Global gradient norm before clipping."""


def train_step(
    par: Parallelized,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[torch.Tensor],
    *,
    grad_accum_steps: int,
    max_grad_norm: float,
    before_update: Callable[[], None] = lambda: None,
    phase: PhaseTracker | None = None,
) -> StepResult:
    """Accumulate gradients over `batches` (token ids, one extra position for the targets), clip,
    and update. `before_update` runs between the last backward and the clipping (a timing hook);
    `phase`, when given, follows forward / backward / optimizer (an OOM report names the phase)."""
    track = phase.enter if phase is not None else lambda name: None
    loss_sum: torch.Tensor | None = None
    for index, batch in enumerate(batches):
        track("forward")
        if par.sync_last_micro_batch_only:
            par.module.set_requires_gradient_sync(index == grad_accum_steps - 1)  # type: ignore[operator]
        logits = par.forward(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        # Mean over micro-batches here; the mean over ranks happens in the gradient reduction.
        track("backward")
        (loss / grad_accum_steps).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    assert loss_sum is not None, "train_step needs at least one micro-batch"
    before_update()
    track("optimizer")
    grad_norm = clip_grad_norm(par.module, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum=loss_sum, grad_norm=grad_norm)
