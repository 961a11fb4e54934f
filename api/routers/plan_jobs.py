"""/plan-jobs: large plan searches and re-plans run as jobs (POST /plans beyond the job threshold, POST
/plans/{id}/replan answer 202 with one): follow them here until they name their plan."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ReadAccess, SessionDep
from api.routers.responses import problems
from api.schemas.plan_jobs import PlanJobId, PlanJobOut
from api.services import plan_jobs as plan_job_service

router = APIRouter(prefix="/plan-jobs", tags=["plans"])


@router.get("/{job_id}", response_model=PlanJobOut, dependencies=[ReadAccess],
            responses=problems(401, 404, 422), summary="Follow a plan job (a large plan search or a re-plan)")
def get_plan_job(job_id: PlanJobId, session: SessionDep) -> PlanJobOut:
    """`queued`, `running`, then `succeeded` (`plan_id`, `plan_url`: the plan) or `failed` (`error`, and
    `problem`: what the request would have been answered with synchronously)."""
    return plan_job_service.get_job(session, job_id)
