"""Fitting the memory model to measured step peaks: the memory half of calibration.

The profiler times whole training steps of the model cut to a few blocks, in both engines and with
checkpointing, for several steps so that optimizer state exists, and records each step's peak
allocated and reserved bytes, and the device's usable memory once CUDA and NCCL have started. From
them the planner fits what its first-principles model cannot know:

- how much activation memory each engine really keeps (inductor's partitioner picks its own saved
  tensors): one scale per engine on the activation term, read from the steps whose transient memory
  is largely activations (`MIN_ACTIVATION_SHARE`);
- how much the caching allocator reserves beyond what is allocated (fragmentation), when the profile
  ran under the allocator the launchers use (`PRICED_ALLOCATOR_CONFIG`): the reserve belongs to the
  allocator's configuration, and one measured without expandable segments is several times the
  launchers' (on an H200 the fit took half the transient memory, and the pick's predicted peak went
  from 62.7 GiB to 76.1 against 65.3 measured, `bench/results/gpu_plans.json`). A profile that did not
  run under it, or did not record its allocator, keeps the uncalibrated reserve and margin, and
  its residuals are read from its allocated peaks;
- how much memory is usable at all (the CUDA context and NCCL's buffers lie outside the allocator);
- the margin a plan keeps: the largest under-prediction the fitted model still makes, plus a step.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from planner.cost.estimate import Estimator
from planner.cost.memory import PRICED_ALLOCATOR_CONFIG, MemoryEstimate, runs_priced_allocator
from planner.cost.parameters import GIB, CostParameters
from planner.cost.setting import Choice, Setting

MARGIN_FLOOR = 0.03
"""The least margin a calibrated plan keeps: real runs differ from the profiled ones in shape."""
MARGIN_STEP = 0.02
"""Added to the largest residual under-prediction: a handful of samples understates the error on
configurations never measured."""
MIN_STEPS = 5
"""Fewer measured steps than this fit as many scales as they have points: their residuals prove
nothing, so the plan keeps the uncalibrated margin."""
MIN_SCALE_STEPS = 2
"""Measured steps of one engine needed before its activation scale moves from 1."""
MIN_ACTIVATION_SHARE = 1 / 3
"""A measured step tells the activations' scale only where they are at least this share of the
transient memory at its peak: what the model misses of the other terms is read as an activation
error magnified by their ratio, at most twice here. (On the H200 the profile's 1- and 4-block
steps, with an unsliced 128k-vocabulary loss, held 13-32% activations, and the eager scale fitted
from them fell to about 0.6 while the 8-block run measured 10% above the unscaled model.)"""
SCALE_BOUNDS = (0.5, 2.0)
RESERVE_BOUNDS = (0.0, 0.5)

MeasuredStep = tuple[Setting, Choice, int, int | None]
"""(setting, choice, peak allocated bytes, peak reserved bytes) of one measured step."""


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _moments(setting: Setting, choice: Choice, params: CostParameters) -> tuple[MemoryEstimate, ...]:
    return Estimator(replace(setting, params=params)).moments(choice)


def _peak(setting: Setting, choice: Choice, params: CostParameters) -> MemoryEstimate:
    return max(_moments(setting, choice, params), key=lambda m: m.total)


def fit_memory(
    steps: list[MeasuredStep],
    params: CostParameters,
    *,
    usable_bytes: int | None,
    device_bytes: int | None,
    profile_id: str,
    allocator_config: str | None,
) -> CostParameters:
    """Memory parameters fitted to measured peaks; `params` kept where nothing was measured.

    `allocator_config`: the `PYTORCH_CUDA_ALLOC_CONF` the steps ran under (None: not recorded). Only
    under the priced allocator do reserved peaks say what a launched plan reserves."""
    changes: dict[str, object] = {}
    if usable_bytes and device_bytes and usable_bytes <= device_bytes:
        changes["memory_capacity_gib"] = device_bytes / GIB
        changes["context_gib"] = (device_bytes - usable_bytes) / GIB
    if not steps:
        return params.with_changes(**changes)
    allocated_only = params.with_changes(
        activation_memory_scale=1.0, compiled_activation_memory_scale=1.0, allocator_reserve=0.0
    )
    # Activation scale per engine, from steps whose measured peak lies above what the update needs
    # (so it was in backward, where activations live) and whose activations are a large enough part
    # of what is transient there (MIN_ACTIVATION_SHARE). Least squares on the activation bytes: a
    # step with few activations (one small block) says little about their scale and weighs little;
    # one step alone is not trusted with a scale that every plan of that engine will carry.
    for compiled, name in ((False, "activation_memory_scale"), (True, "compiled_activation_memory_scale")):
        points = []
        for setting, choice, allocated, _ in steps:
            if choice.compile != compiled:
                continue
            *backward, update = _moments(setting, choice, allocated_only)
            peak = max(backward, key=lambda m: m.total)
            transient = peak.total - peak.params - peak.optimizer - peak.workspace
            telling = peak.activations >= MIN_ACTIVATION_SHARE * transient
            if peak.activations > 0 and telling and allocated > update.total:
                points.append((peak.activations, allocated - (peak.total - peak.activations)))
        if len(points) >= MIN_SCALE_STEPS:
            scale = sum(a * r for a, r in points) / sum(a * a for a, _ in points)
            changes[name] = _clamp(scale, SCALE_BOUNDS)
    fitted = allocated_only.with_changes(**changes)

    # Reserved beyond allocated, as a fraction of the transient allocations at the peak: only what
    # the launchers' allocator reserves says anything about a launched plan.
    priced_allocator = runs_priced_allocator(allocator_config)
    reserves = []
    for setting, choice, allocated, reserved in steps:
        peak = _peak(setting, choice, fitted)
        transient = peak.total - peak.params - peak.optimizer - peak.workspace
        if priced_allocator and reserved is not None and transient > 0:
            reserves.append((reserved - allocated) / transient)
    reserve = _clamp(statistics.median(reserves), RESERVE_BOUNDS) if reserves else params.allocator_reserve
    fitted = fitted.with_changes(allocator_reserve=reserve)

    # The margin: how far the fitted model still falls short of a measured peak; reserved peaks of
    # another allocator are compared by their allocated part, the part the allocator cannot change.
    errors = []
    for setting, choice, allocated, reserved in steps:
        peak = _peak(setting, choice, fitted)
        if priced_allocator:
            predicted, measured = peak.total, reserved or allocated
        else:
            predicted, measured = peak.total - peak.allocator_reserve, allocated
        errors.append((measured - predicted) / predicted)
    worst = max(0.0, max(errors))
    mean_abs = sum(abs(e) for e in errors) / len(errors)
    evidence = (
        f"calibrated ({profile_id}): over {len(errors)} measured steps the fitted memory model's "
        f"largest under-prediction is {worst:.1%} (mean error {mean_abs:.1%})"
    )
    if not priced_allocator:
        ran = (
            "did not record its allocator"
            if allocator_config is None
            else f"ran under PYTORCH_CUDA_ALLOC_CONF={allocator_config!r}"
        )
        evidence += (
            f" in allocated bytes; the profile {ran}, not the launchers' {PRICED_ALLOCATOR_CONFIG}, so "
            f"the uncalibrated allocator reserve ({reserve:.0%} of transient memory) stays"
        )
    margin = max(MARGIN_FLOOR, worst + MARGIN_STEP)
    if not priced_allocator and margin < params.memory_margin:
        # Its reserved peaks say nothing of a launched plan's: the margin cannot be narrowed on them.
        return fitted.with_changes(
            memory_margin=params.memory_margin,
            memory_margin_reason=f"{evidence}; nor the uncalibrated margin {params.memory_margin:.0%}",
        )
    if len(errors) < MIN_STEPS and margin < params.memory_margin:
        return fitted.with_changes(
            memory_margin=params.memory_margin,
            memory_margin_reason=f"{evidence}; fewer than {MIN_STEPS} steps cannot check the fit, so the "
            f"uncalibrated {params.memory_margin:.0%} stays",
        )
    return fitted.with_changes(
        memory_margin=margin,
        memory_margin_reason=(
            f"{evidence}; the margin is that + {MARGIN_STEP:.0%}, at least {MARGIN_FLOOR:.0%}"
        ),
    )
