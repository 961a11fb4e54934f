"""One optimizer step: forward and backward over the micro-batches, gradient clipping, update.

The trainer runs it every step and the calibration profiler times it, so what calibration measures
of a whole step is exactly what training does. Models that compute their own loss (the built-in
ones) get the targets and the plan's `loss_chunks`, so the output projection and cross-entropy run
in token slices and the full logits never exist; any other model returns logits and the loss is
taken here, unchunked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from executor.runtime.models import computes_own_loss
from executor.runtime.models.moe import set_aux_loss_scale
from executor.runtime.oom import PhaseTracker
from executor.runtime.optim import clip_grad_norm
from executor.runtime.parallelize import Parallelized


@dataclass(frozen=True, slots=True)
class StepResult:
    loss_sum: torch.Tensor
    """Sum of the micro-batch losses (on the device; not yet averaged over ranks). With pp > 1
    only the ranks holding the last stage have it; the others hold zero."""
    grad_norm: float
    """Global gradient norm before clipping."""


def batch_loss(par: Parallelized, batch: torch.Tensor, *, loss_chunks: int) -> torch.Tensor:
    """Mean next-token cross-entropy of a [b, t + 1] token batch: the model's own sliced loss, or
    cross-entropy on the logits of a model that returns them (training and evaluation alike)."""
    if par.pipeline is not None:
        # The rank's share of the model is no model to call: its stages run through the schedule.
        raise ValueError("batch_loss: under a pipeline the schedule runs the forward (PipelineRun.step)")
    inputs, targets = batch[:, :-1], batch[:, 1:]
    if computes_own_loss(par.module):
        return par.forward(inputs, targets, loss_chunks=loss_chunks)
    logits = par.forward(inputs)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def train_step(
    par: Parallelized,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[torch.Tensor],
    *,
    grad_accum_steps: int,
    max_grad_norm: float,
    loss_chunks: int,
    before_update: Callable[[], None] = lambda: None,
    phase: PhaseTracker | None = None,
) -> StepResult:
    """Accumulate gradients over `batches` (token ids, one extra position for the targets), clip,
    and update. `loss_chunks` is the number of token slices of the output projection and loss (the
    plan's `config.loss_chunks`; ignored by models that return logits). `before_update` runs between
    the last backward and the clipping (a timing hook); `phase`, when given, follows forward /
    backward / optimizer (an OOM report names the phase). With pp > 1 (`par.pipeline`) the
    micro-batches go to the schedule as one batch (`PipelineRun.step`): inputs into the first
    stage, targets to the last."""
    track = phase.enter if phase is not None else lambda name: None
    if par.pipeline is not None:
        track("pipeline")  # the schedule interleaves the micro-batches' forwards and backwards
        loss_sum = par.pipeline.step(torch.cat(list(batches)))
        return _update(par, optimizer, loss_sum, max_grad_norm=max_grad_norm, before_update=before_update,
                       track=track)
    # Each micro-batch's loss is divided by their number below; the MoE blocks' auxiliary loss too
    # (under a pipeline the schedule scales every gradient instead).
    set_aux_loss_scale(par.module, 1.0 / grad_accum_steps)
    loss_sum: torch.Tensor | None = None
    for index, batch in enumerate(batches):
        track("forward")
        if par.sync_last_micro_batch_only:
            par.module.set_requires_gradient_sync(index == grad_accum_steps - 1)  # type: ignore[operator]
        loss = batch_loss(par, batch, loss_chunks=loss_chunks)
        # Mean over micro-batches here; the mean over ranks happens in the gradient reduction.
        track("backward")
        (loss / grad_accum_steps).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    assert loss_sum is not None, "train_step needs at least one micro-batch"
    return _update(par, optimizer, loss_sum, max_grad_norm=max_grad_norm, before_update=before_update,
                   track=track)


def _update(
    par: Parallelized,
    optimizer: torch.optim.Optimizer,
    loss_sum: torch.Tensor,
    *,
    max_grad_norm: float,
    before_update: Callable[[], None],
    track: Callable[[str], None],
) -> StepResult:
    """Clip (over every pipeline stage when pp > 1) and update, after the last backward."""
    before_update()
    track("optimizer")
    pipeline = par.pipeline
    grad_norm = clip_grad_norm(
        par.module,
        max_grad_norm,
        pipeline_group=pipeline.group if pipeline is not None else None,
        counted_elsewhere=pipeline.counted_elsewhere if pipeline is not None else (),
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if par.after_optimizer_step is not None:
        par.after_optimizer_step(par.module)
    return StepResult(loss_sum=loss_sum, grad_norm=grad_norm)
