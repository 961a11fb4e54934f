"""Bodies of the validation-run endpoints: what a few real steps of a plan measured."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

Seconds = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]


class RunCreate(BaseModel):
    """Measurements of a plan's launcher (`fsdp-planner validate --upload` sends these)."""

    model_config = ConfigDict(extra="forbid")

    measured_step_time_s: Seconds
    """Median optimizer-step time over the measured steps (warm-up excluded)."""
    measured_tokens_per_s_per_gpu: Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)]
    measured_peak_memory_gib: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] | None = None
    """Peak memory per device as the runtime sees it (CUDA allocator, or live tensors on CPU)."""
    steps: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    """Steps measured."""
    raw: Annotated[dict[str, Any], Field(max_length=64)] = {}
    """The run's report: per-step metrics, environment (kept as sent)."""


class RunOut(BaseModel):
    """A validation run: measured beside predicted, with the prediction error."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    plan_id: int
    measured_step_time_s: float
    measured_tokens_per_s_per_gpu: float
    measured_peak_memory_gib: float | None
    predicted_step_time_s: float
    predicted_tokens_per_s_per_gpu: float
    predicted_peak_memory_gib: float
    step_time_error_pct: float
    """(predicted - measured) / measured x 100: positive means the plan promised too slow a step."""
    tokens_per_s_error_pct: float
    peak_memory_error_pct: float | None
    created_at: datetime


class RunPage(BaseModel):
    items: list[RunOut]
