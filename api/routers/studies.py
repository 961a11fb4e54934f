"""/studies: what-if studies as jobs (create: queue; follow with get; cancel; list; delete)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api.deps import ReadAccess, SessionDep, SettingsDep, WriteAccess
from api.routers.plans import IdempotencyKey
from api.routers.responses import location, problems
from api.schemas.plans import MAX_ID
from api.schemas.studies import StudyCreate, StudyDetail, StudyId, StudyPage
from api.services import studies as study_service

router = APIRouter(prefix="/studies", tags=["studies"])


@router.post(
    "",
    status_code=202,
    response_model=StudyDetail,
    dependencies=[WriteAccess],
    responses=problems(401, 409, 415, 422),
    summary="Queue a study: plan a model on every candidate cluster (GPU types x sizes) as a job",
)
def create_study(
    body: StudyCreate, request: Request, response: Response, session: SessionDep, settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> StudyDetail:
    """Answers at once with the study `queued` (202, `Location`: the study); its job searches each
    candidate like `POST /plans`, in parallel, apart from plan requests. Follow it with `GET` (state,
    `candidates_done` of `num_candidates`, fitting so far, `best_so_far`); once `succeeded` each fitting
    cluster's plan is stored as an ordinary plan, with its launchers. A cluster that does not fit is a
    point with `fits: false` and the reason, not an error; 422 is for invalid inputs only (checked
    before anything is queued). With an `Idempotency-Key`, a retry gets the same study."""
    submission = study_service.submit_study(
        session, body, locks=request.app.state.plan_locks, max_model_layers=settings.max_model_layers,
        idempotency_key=idempotency_key, idempotency_ttl_s=settings.idempotency_ttl_s,
        enqueue=request.app.state.jobs.enqueue,
    )
    if submission.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        request.app.state.jobs.submit(submission.study_id)
    response.headers["Location"] = location(request, "get_study", study_id=submission.study_id)
    return study_service.get_study(session, submission.study_id)


@router.post("/{study_id}/cancel", response_model=StudyDetail, dependencies=[WriteAccess],
             responses=problems(401, 404, 409, 422), summary="Stop a queued or running study")
def cancel_study(study_id: StudyId, session: SessionDep) -> StudyDetail:
    """The study becomes `cancelled` at once; its job stops searching and stores nothing. 409 when the
    study has finished already (cancelling a cancelled study is fine)."""
    study_service.cancel_study(session, study_id)
    return study_service.get_study(session, study_id)


@router.get("", response_model=StudyPage, dependencies=[ReadAccess], responses=problems(401, 422),
            summary="List stored studies, newest first")
def list_studies(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200, description="Studies per page")] = 50,
    cursor: Annotated[str | None, Query(
        max_length=len(str(MAX_ID)), pattern=r"^[0-9]*$", description="`next_cursor` of the previous page"
    )] = None,
) -> StudyPage:
    # A cursor is a study id (the list continues below it). The pattern and length admit only ASCII
    # digits below 10^16, so every schema-valid cursor is read, clamped to the ids that exist (2^63
    # overflowed SQLite's integers and PostgreSQL's bigint): `00` is an empty page, not an error.
    after = min(int(cursor), MAX_ID) if cursor else None
    items, next_cursor = study_service.list_studies(session, limit=limit, cursor=after)
    return StudyPage(items=items, next_cursor=next_cursor)


@router.get("/{study_id}", response_model=StudyDetail, dependencies=[ReadAccess],
            responses=problems(401, 404, 422), summary="Get a study with every candidate cluster's outcome")
def get_study(study_id: StudyId, session: SessionDep) -> StudyDetail:
    return study_service.get_study(session, study_id)


@router.delete("/{study_id}", status_code=204, dependencies=[WriteAccess], responses=problems(401, 404, 422),
               summary="Delete a study, stopping it if it runs (its plans stay: they are ordinary plans)")
def delete_study(study_id: StudyId, session: SessionDep) -> Response:
    study_service.delete_study(session, study_id)
    return Response(status_code=204)
