"""The /plan-jobs resource: a large plan search or a re-plan, run as a job (answered 202 by the POST)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel

from api.schemas.plans import MAX_ID

PlanJobId = Annotated[int, Path(ge=1, le=MAX_ID, description="A plan job's id")]


class PlanJobState(StrEnum):
    """Where a plan job is: `queued` and `running` go on; `succeeded` and `failed` are final."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class PlanJobOut(BaseModel):
    """A plan search running as a job. Poll it (`GET /api/v1/plan-jobs/{id}`) until `state` is final:
    then `plan_id` names the plan (`plan_url`), or `error` says why there is none (`problem`: the problem
    document the request would have been answered with, had it been planned synchronously)."""

    id: int
    kind: Literal["plan", "replan"]
    """`plan`: a POST /plans whose layer graph is beyond the server's job threshold; `replan`: POST
    /plans/{id}/replan."""
    state: PlanJobState
    name: str
    units: int
    """Layer-graph units (or layers) of the model planned."""
    source_plan_id: int | None = None
    """The plan re-planned (kind `replan`)."""
    plan_id: int | None = None
    """The plan stored (or found stored) once the job has succeeded."""
    plan_url: str | None = None
    """Where that plan is: `/api/v1/plans/{plan_id}`."""
    status_code: int | None = None
    """What the request would have answered synchronously: 201 (stored now) or 200 (stored before)."""
    error: str | None = None
    problem: dict[str, Any] | None = None
    attempts: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
