"""Bodies of the validation-run endpoints: what a few real steps of a plan measured, or where it ran
out of memory."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api.schemas.plans import MAX_JSON_DEPTH
from planner.bounds import MemoryGiB, StepSeconds, TokensPerSecond
from planner.calibration import MAX_DEVICE_BYTES

# 1 PiB, as for calibration profiles: beyond any device, and below 2^53, so that every client (and
# schema validator) comparing in floats reads the bound exactly.
Bytes = Annotated[int, Field(ge=0, le=MAX_DEVICE_BYTES)]
RunOutcome = Literal["completed", "oom"]


class OomDetails(BaseModel):
    """Where a run ran out of memory: the trainer's `{"event": "oom"}` record of the failing rank."""

    model_config = ConfigDict(extra="forbid")

    step: Annotated[int, Field(ge=0, le=1_000_000_000)] | None = None
    """The optimizer step being run (null: before the first step)."""
    phase: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z_]+$")]
    """setup, resume, data, forward, backward, optimizer, sync or checkpoint."""
    requested_bytes: Bytes | None = None
    """The allocation that failed, when the allocator's message names it."""
    allocated_bytes: Bytes | None = None
    """CUDA allocator: bytes held by tensors when it failed (null on CPU)."""
    reserved_bytes: Bytes | None = None
    """CUDA allocator: bytes reserved from the driver (null on CPU)."""
    message: Annotated[str, Field(max_length=2000)] = ""
    """The allocator's message, on one line (NUL, like any text no database stores, is refused for every
    request: api/text_check.py)."""


class RunCreate(BaseModel):
    """Measurements of a plan's launcher (`fsdp-planner validate --upload` sends these).

    `outcome` defaults to `completed`, which needs the two measurements; an `oom` run needs `oom`
    and may carry measurements of the steps before it failed.
    """

    # The two shapes, stated in the schema too, so that clients (and schemathesis) see what
    # `_consistent` below enforces.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {
                    "properties": {
                        "outcome": {"const": "completed"},
                        "measured_step_time_s": {"type": "number"},
                        "measured_tokens_per_s_per_gpu": {"type": "number"},
                        "steps": {"minimum": 1},
                        "oom": {"type": "null"},
                    },
                    "required": ["measured_step_time_s", "measured_tokens_per_s_per_gpu"],
                },
                {
                    "properties": {"outcome": {"const": "oom"}, "oom": {"type": "object"}},
                    "required": ["outcome", "oom"],
                },
            ]
        },
    )

    outcome: RunOutcome = "completed"
    measured_step_time_s: StepSeconds | None = None
    """Median optimizer-step time over the measured steps (warm-up excluded). Required when completed."""
    measured_tokens_per_s_per_gpu: TokensPerSecond | None = None
    """Required when completed."""
    measured_peak_memory_gib: MemoryGiB | None = None
    """Peak memory per device as the runtime sees it (CUDA allocator, or live tensors on CPU)."""
    steps: Annotated[int, Field(ge=0, le=1_000_000)] = 1
    """Steps measured (an OOM run may have measured none)."""
    oom: OomDetails | None = None
    """Required when outcome is `oom`, refused otherwise."""
    raw: Annotated[dict[str, Any], Field(max_length=64)] = {}
    """The run's report: per-step metrics, environment (kept as sent)."""

    @field_validator("raw")
    @classmethod
    def _storable(cls, raw: dict[str, Any]) -> dict[str, Any]:
        _finite_json(raw, depth=0)
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> RunCreate:
        if self.outcome == "completed":
            missing = [
                name for name in ("measured_step_time_s", "measured_tokens_per_s_per_gpu")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(
                    f"a completed run needs {' and '.join(missing)}; for a run that ran out of memory "
                    'send "outcome": "oom" with an "oom" object'
                )
            if self.oom is not None:
                raise ValueError('"oom" details belong to a run with "outcome": "oom"')
            if self.steps < 1:
                raise ValueError("a completed run measured at least 1 step")
        elif self.oom is None:
            raise ValueError(
                'an "outcome": "oom" run needs "oom": {"phase": ..., "step": ..., "requested_bytes": ...} '
                "(the trainer's OOM record)"
            )
        return self


def _finite_json(value: Any, *, depth: int, path: str = "raw") -> None:
    """Refuse nesting beyond MAX_JSON_DEPTH, and NaN and infinities (1e400 reads as one): JSON has no
    such numbers, so PostgreSQL refuses them and SQLite would store text no JSON reader takes back.
    (Text no database can store, NUL or a lone surrogate, never gets here: api/text_check.py.)"""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"raw: nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(
            f"{path}: {value} is not a JSON number (NaN, or too large for a double); send a finite number, "
            "or null for a value that was not measured"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _finite_json(item, depth=depth + 1, path=f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _finite_json(item, depth=depth + 1, path=f"{path}.{index}")


class RunOut(BaseModel):
    """A validation run: measured beside predicted, with the prediction error (null for OOM runs)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    plan_id: int
    outcome: RunOutcome
    measured_step_time_s: float | None
    measured_tokens_per_s_per_gpu: float | None
    measured_peak_memory_gib: float | None
    predicted_step_time_s: float
    predicted_tokens_per_s_per_gpu: float
    predicted_peak_memory_gib: float
    step_time_error_pct: float | None
    """(predicted - measured) / measured x 100: positive means the plan promised too slow a step."""
    tokens_per_s_error_pct: float | None
    peak_memory_error_pct: float | None
    oom: OomDetails | None = None
    """Where the run ran out of memory (outcome `oom`)."""
    created_at: datetime

    @model_validator(mode="before")
    @classmethod
    def _oom_from_row(cls, data: Any) -> Any:
        # A stored row keeps the details in oom_* columns; the API shows them as one object.
        if getattr(data, "outcome", None) == "oom":
            details = OomDetails(
                step=data.oom_step, phase=data.oom_phase or "unknown",
                requested_bytes=data.oom_requested_bytes, allocated_bytes=data.oom_allocated_bytes,
                reserved_bytes=data.oom_reserved_bytes, message=data.oom_message or "",
            )
            fields = {name: getattr(data, name) for name in cls.model_fields if name != "oom"}
            return {**fields, "oom": details}
        return data


class RunPage(BaseModel):
    items: list[RunOut]
