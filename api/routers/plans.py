"""/plans: create (dedup + idempotency), list (filters, sort, cursor), compare, get, delete."""

from __future__ import annotations

import inspect
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import delete, select
from starlette.convertors import Convertor, register_url_convertor

from api.db.models import PlanRow
from api.deps import ReadAccess, SessionDep, SettingsDep, WriteAccess, run_planning, search_share
from api.problems import FieldError, ProblemError
from api.routers.responses import location, problems
from api.schemas.plan_jobs import PlanJobOut
from api.schemas.plans import (
    MAX_NODES,
    ComparedPlan,
    ComparisonRow,
    PlanComparison,
    PlanCreate,
    PlanDetail,
    PlanId,
    PlanPage,
    PlanSort,
    PlanSummary,
    ReplanCreate,
    SortOrder,
)
from api.services import plan_compare, plan_jobs, plan_listing
from api.services import plans as plan_service
from api.services.plan_documents import UnreadablePlanError
from contract.mesh import AXES
from contract.parallel_config import ShardingStrategy
from planner.bounds import max_degree

router = APIRouter(prefix="/plans", tags=["plans"])


class _PlanIdSegment(Convertor[str]):
    """`/plans/{plan_id}`'s segment: anything but `compare` (then the int check names a bad id), so that
    /plans/compare is never taken for a plan: not for GET, and not by OPTIONS/405 `Allow` for DELETE."""

    regex = "(?!compare$)[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return str(value)


register_url_convertor("plan_id", _PlanIdSegment())

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
        description="Makes retries safe: the same key with the same body replays the first response "
        "(for 24 h by default); the same key with another body is refused with 422 and stores nothing.",
    ),
]

Cursor = Annotated[
    str | None,
    Query(
        max_length=2000, pattern=r"^[A-Za-z0-9_-]*$",
        description="`next_cursor` of the previous page; absent or empty for the first page",
    ),
]


def _text_query(max_length: int, description: str) -> Query:
    return Query(max_length=max_length, description=description)


def _mesh_filters(**degrees: int | None) -> dict[str, int | None]:
    """The list's mesh filters, one query parameter per axis a request can pin (`?tp=8&pp=4`): its
    parameters are made from the registry below."""
    return degrees


_mesh_filters.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter(axis.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        int | None, Query(
            ge=1, le=max_degree(axis),  # what a request may pin: a plan's mesh is one of those
            description=f"{axis.what.capitalize()} degree of the chosen mesh "
            f"(1: plans without {axis.what.replace('-parallel', ' parallelism')})",
        ),
    ])
    for axis in AXES if axis.search_field
])


# Sync endpoints: FastAPI runs them in its worker thread pool, so the blocking database calls never
# stall the event loop (plan creation runs in threads of its own, see create_plan; the CPU-bound search
# itself in the app's search pool).
@router.post(
    "",
    status_code=201,
    response_model=PlanDetail,
    dependencies=[WriteAccess],
    responses={
        200: {"model": PlanDetail, "description": "Identical inputs were planned before: the stored plan"},
        202: {"model": PlanJobOut, "description": "A model beyond the server's job threshold "
              "(FSDP_PLANNER_JOB_THRESHOLD_UNITS layer-graph units): its search is queued as a plan job; "
              "poll `Location` until it names the plan"},
        **problems(401, 409, 415, 422, 429, 503),
    },
    summary="Plan a model on a cluster and store the plan",
)
async def create_plan(
    body: PlanCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> PlanDetail | JSONResponse:
    """Searches and stores the plan (201; 200 when identical inputs were planned before). A model with
    more layer-graph units than the server's job threshold is searched as a job instead: 202 with the
    plan job (`Location`: /api/v1/plan-jobs/{id}), whose `plan_id` names the plan once it has succeeded."""
    units = plan_jobs.units_of(body)
    keyed_job = idempotency_key is not None and await run_planning(request, partial(
        plan_jobs.has_keyed_job, session, idempotency_key, plan_service.fingerprint(body),
        settings.idempotency_ttl_s,
    ))
    if keyed_job or (units is not None and units > settings.job_threshold_units):
        async with search_share(request):  # a refused batch's advice is searched before the job is queued
            submission = await run_planning(request, partial(
                plan_jobs.submit_plan, session, body, locks=request.app.state.plan_locks,
                max_model_layers=settings.max_model_layers, search_pool=request.app.state.search_pool,
                idempotency_key=idempotency_key,
                idempotency_ttl_s=settings.idempotency_ttl_s, enqueue=request.app.state.plan_jobs.enqueue,
            ))
        if submission is not None:
            return job_accepted(request, session, submission)
    # In a thread of its own limiter: requests waiting for a search never take the threads reads need;
    # and no more at once from one client than its share of the search pool.
    async with search_share(request):
        outcome = await run_planning(request, partial(
            plan_service.create_plan, session, body, locks=request.app.state.plan_locks,
            search_pool=request.app.state.search_pool, max_model_layers=settings.max_model_layers,
            idempotency_key=idempotency_key, idempotency_ttl_s=settings.idempotency_ttl_s,
        ))
    response.status_code = outcome.status_code
    response.headers["Location"] = location(request, "get_plan", plan_id=outcome.row.id)
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return PlanDetail.model_validate(outcome.row)


@router.get(
    "",
    response_model=PlanPage,
    dependencies=[ReadAccess],
    responses=problems(401, 422),
    summary="List stored plans",
)
def list_plans(
    request: Request,
    response: Response,
    session: SessionDep,
    mesh: Annotated[dict[str, int | None], Depends(_mesh_filters)],
    limit: Annotated[int, Query(ge=1, le=200, description="Plans per page")] = 50,
    cursor: Cursor = None,
    sort: Annotated[PlanSort, Query(description="Column to sort on")] = PlanSort.created_at,
    order: Annotated[SortOrder, Query(description="Sort direction")] = SortOrder.desc,
    model: Annotated[str | None, _text_query(200, "Model name (case-insensitive)")] = None,
    gpu: Annotated[str | None, _text_query(64, "GPU catalog name or alias")] = None,
    nodes: Annotated[int | None, Query(ge=1, le=MAX_NODES, description="Number of nodes")] = None,
    q: Annotated[str | None, _text_query(200, "Substring of the plan name")] = None,
    sharding: Annotated[ShardingStrategy | None, Query(description="Chosen sharding strategy")] = None,
) -> PlanPage:
    filters = plan_listing.PlanFilters(model=model, gpu=gpu, nodes=nodes, q=q, sharding=sharding, **mesh)
    rows, next_cursor = plan_listing.list_plans(
        session, filters=filters, sort=sort, order=order, limit=limit, cursor=cursor or None
    )
    if next_cursor is not None:
        following = request.url.include_query_params(cursor=next_cursor)  # a path, as `location` writes
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return PlanPage(items=[PlanSummary.model_validate(row) for row in rows], next_cursor=next_cursor)


@router.get(
    "/compare",
    response_model=PlanComparison,
    dependencies=[ReadAccess],
    responses=problems(401, 404, 422),
    summary="Compare stored plans side by side: inputs, configuration, predictions and what differs",
)
def compare_plans(
    request: Request,
    session: SessionDep,
    ids: Annotated[str, Query(
        max_length=200,
        description=f"{plan_compare.MIN_COMPARED} to {plan_compare.MAX_COMPARED} plan ids, comma-separated "
        "(the dashboard's /compare?ids=... takes the same)",
        examples=["3,7"],
        # Documented for clients; checked by plan_compare so that a bad value gets a message with the fix.
        json_schema_extra={"pattern": plan_compare.IDS_PATTERN},
    )],
) -> PlanComparison:
    # `ids=3&ids=7` works too, as on the dashboard: every value is read, not only the last.
    try:
        parsed = plan_compare.parse_query_ids(request.query_params.getlist("ids") or [ids])
        plans = plan_compare.load_plans(session, parsed)
    except (plan_compare.CompareIdsError, UnreadablePlanError) as exc:
        error = FieldError(location="query", field="ids", message=str(exc), type="value_error")
        raise ProblemError(422, f"ids: {exc}", slug="invalid-request", title="Invalid request",
                           errors=[error]) from None
    except plan_compare.MissingPlansError as exc:
        raise ProblemError(404, f"{exc}; list plans with GET /api/v1/plans", slug="plan-not-found",
                           title="Plan not found", missing_ids=exc.missing) from None
    rows = plan_compare.compare(plans)
    return PlanComparison(
        ids=parsed,
        plans=[
            ComparedPlan(id=row.id, name=row.name, created_at=row.created_at,
                         training=plan.training.model_dump(mode="json"),
                         config=plan.config.as_document(),
                         prediction=plan.prediction.model_dump(mode="json"))
            for row, plan in plans
        ],
        fields=[
            ComparisonRow(field=c.field.key, section=c.field.section, label=c.field.label,
                          values=c.values, differs=c.differs, best=c.best)
            for c in rows
        ],
        differences=[c.field.key for c in rows if c.differs],
    )


@router.get(
    "/{plan_id:plan_id}",
    response_model=PlanDetail,
    dependencies=[ReadAccess],
    responses=problems(401, 404, 422),
    summary="Get a stored plan with its whole Plan document",
)
def get_plan(plan_id: PlanId, session: SessionDep) -> PlanDetail:
    row = session.scalar(select(PlanRow).where(PlanRow.id == plan_id).options(*plan_service.full_plan()))
    if row is None:
        raise plan_service.plan_not_found(plan_id)
    return PlanDetail.model_validate(row)


@router.delete(
    "/{plan_id:plan_id}",
    status_code=204,
    dependencies=[WriteAccess],
    responses=problems(401, 404, 422),
    summary="Delete a stored plan (and its validation runs)",
)
def delete_plan(plan_id: PlanId, session: SessionDep) -> Response:
    deleted = session.execute(delete(PlanRow).where(PlanRow.id == plan_id).returning(PlanRow.id)).first()
    if deleted is None:
        raise plan_service.plan_not_found(plan_id)
    session.commit()
    return Response(status_code=204)


@router.post(
    "/{plan_id}/replan",
    status_code=202,
    response_model=PlanJobOut,
    dependencies=[WriteAccess],
    responses=problems(401, 404, 409, 415, 422),
    summary="Re-plan a plan's request without every configuration as memory-hungry as one that ran out of "
    "memory (a plan job)",
)
def replan(
    plan_id: PlanId,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    body: ReplanCreate | None = None,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """The failed configuration is the plan's own (its newest OOM run's, or `run_id`'s); it is re-priced
    with the current planner, and the new plan only considers configurations predicted below that peak
    (`request.search.max_peak_memory_gib`, exclusive). A re-plan is a job: 202 with the plan job
    (`Location`: /api/v1/plan-jobs/{id}); once `succeeded` its `plan_id` names the new plan (or the one
    stored by an earlier re-plan of the same failure), once `failed` its `error` says why (nothing lighter
    fits: `problem` is the infeasible-plan problem). 404/422 at once for an unknown plan or run."""
    submission = plan_jobs.submit_replan(
        session, plan_id, body or ReplanCreate(), locks=request.app.state.plan_locks,
        idempotency_key=idempotency_key, idempotency_ttl_s=settings.idempotency_ttl_s,
        enqueue=request.app.state.plan_jobs.enqueue,
    )
    return job_accepted(request, session, submission)


def job_accepted(request: Request, session: SessionDep, submission: plan_jobs.Submission) -> JSONResponse:
    """202 with the plan job, `Location` to poll; a new job is handed to the engine now."""
    headers = {"Location": location(request, "get_plan_job", job_id=submission.job_id), "Retry-After": "1"}
    job = plan_jobs.get_job(session, submission.job_id)  # as accepted: the job may end any moment
    if submission.replayed:
        headers["Idempotent-Replayed"] = "true"
    else:
        request.app.state.plan_jobs.submit(submission.job_id)
    return JSONResponse(job.model_dump(mode="json"), status_code=202, headers=headers)
