"""Bodies of the /calibrations endpoints (the upload body is the planner's CalibrationProfile)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class CalibrationSummary(BaseModel):
    """A stored profile as lists show it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    fingerprint: dict[str, Any]
    created_at: datetime


class CalibrationDetail(CalibrationSummary):
    """A stored profile with its measurements and the cost parameters fitted to them."""

    profile: dict[str, Any]
    """The uploaded CalibrationProfile document."""
    fitted_parameters: dict[str, Any] | None
    """Per precision (`bf16`, `fp32`): the fitted cost parameters; `*_catalog`: the defaults they replace."""


class CalibrationPage(BaseModel):
    items: list[CalibrationSummary]
    next_cursor: int | None
    """Pass as `before` to get the next (older) page; null on the last page."""
