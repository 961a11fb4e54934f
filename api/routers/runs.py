"""/plans/{id}/runs: store validation runs of a plan (measured vs predicted) and list them."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request, Response
from sqlalchemy import select

from api.db.models import PlanRow, ValidationRunRow
from api.deps import ReadAccess, SessionDep, WriteAccess
from api.routers.responses import location, problems
from api.schemas.plans import PlanId
from api.schemas.runs import RunCreate, RunOut, RunPage
from api.services import plans as plan_service

router = APIRouter(prefix="/plans/{plan_id}/runs", tags=["validation runs"])


def _error_pct(predicted: float, measured: float | None) -> float | None:
    """(predicted - measured) / measured in percent; None where there is no finite answer."""
    if not measured:
        return None
    error = (predicted - measured) / measured * 100.0
    # Measurements are bounded, but a stored prediction is only finite: the ratio may overflow.
    return error if math.isfinite(error) else None


def _plan(session: SessionDep, plan_id: int) -> PlanRow:
    row = session.get(PlanRow, plan_id)
    if row is None:
        raise plan_service.plan_not_found(plan_id)
    return row


@router.post(
    "",
    status_code=201,
    response_model=RunOut,
    dependencies=[WriteAccess],
    responses=problems(401, 404, 415, 422),
    summary="Store a validation run: what the plan's launcher measured beside what it predicted, or where "
    "it ran out of memory",
)
def create_run(
    plan_id: PlanId, body: RunCreate, request: Request, response: Response, session: SessionDep
) -> RunOut:
    plan = _plan(session, plan_id)
    completed = body.outcome == "completed"
    oom = body.oom
    row = ValidationRunRow(
        plan_id=plan.id,
        outcome=body.outcome,
        measured_step_time_s=body.measured_step_time_s,
        measured_tokens_per_s_per_gpu=body.measured_tokens_per_s_per_gpu,
        measured_peak_memory_gib=body.measured_peak_memory_gib,
        predicted_step_time_s=plan.step_time_s,
        predicted_tokens_per_s_per_gpu=plan.tokens_per_s_per_gpu,
        predicted_peak_memory_gib=plan.peak_memory_gib,
        # An OOM run's partial measurements are no test of the prediction: no errors, so accuracy
        # views leave it out.
        step_time_error_pct=_error_pct(plan.step_time_s, body.measured_step_time_s) if completed else None,
        tokens_per_s_error_pct=(
            _error_pct(plan.tokens_per_s_per_gpu, body.measured_tokens_per_s_per_gpu) if completed else None
        ),
        peak_memory_error_pct=(
            _error_pct(plan.peak_memory_gib, body.measured_peak_memory_gib) if completed else None
        ),
        oom_step=oom.step if oom else None,
        oom_phase=oom.phase if oom else None,
        oom_requested_bytes=oom.requested_bytes if oom else None,
        oom_allocated_bytes=oom.allocated_bytes if oom else None,
        oom_reserved_bytes=oom.reserved_bytes if oom else None,
        oom_message=oom.message if oom else None,
        raw={**body.raw, "steps": body.steps},
    )
    session.add(row)
    session.commit()
    response.headers["Location"] = location(request, "list_runs", plan_id=plan.id)
    return RunOut.model_validate(row)


@router.get(
    "",
    response_model=RunPage,
    dependencies=[ReadAccess],
    responses=problems(401, 404, 422),
    summary="List a plan's validation runs, newest first",
)
def list_runs(plan_id: PlanId, session: SessionDep) -> RunPage:
    _plan(session, plan_id)
    rows = session.scalars(
        select(ValidationRunRow)
        .where(ValidationRunRow.plan_id == plan_id)
        .order_by(ValidationRunRow.id.desc())
    )
    return RunPage(items=[RunOut.model_validate(r) for r in rows])
