"""/studies: what-if studies (create: plan every candidate cluster in parallel; list; get; delete)."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api.deps import ReadAccess, SessionDep, SettingsDep, WriteAccess, run_planning
from api.routers.responses import problems
from api.schemas.plans import MAX_ID
from api.schemas.studies import StudyCreate, StudyDetail, StudyId, StudyPage
from api.services import studies as study_service

router = APIRouter(prefix="/studies", tags=["studies"])


@router.post(
    "",
    status_code=201,
    response_model=StudyDetail,
    dependencies=[WriteAccess],
    responses=problems(401, 409, 415, 422, 503),
    summary="Plan a model on every candidate cluster (GPU types x sizes) and store the study",
)
async def create_study(
    body: StudyCreate, request: Request, response: Response, session: SessionDep, settings: SettingsDep
) -> StudyDetail:
    """Each candidate is searched like `POST /plans` (in parallel on the server's cores); a fitting
    cluster's plan is stored as an ordinary plan, with its launchers. A cluster that does not fit is a
    point with `fits: false` and the reason, not an error; 422 is for invalid inputs only."""
    study_id = await run_planning(request, partial(
        study_service.create_study, session, body, search_pool=request.app.state.search_pool,
        max_model_layers=settings.max_model_layers,
    ))
    response.headers["Location"] = str(request.url_for("get_study", study_id=study_id))
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
               summary="Delete a study (its plans stay: they are ordinary plans)")
def delete_study(study_id: StudyId, session: SessionDep) -> Response:
    study_service.delete_study(session, study_id)
    return Response(status_code=204)
