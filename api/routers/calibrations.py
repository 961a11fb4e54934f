"""/calibrations: upload a profile (validated and fitted), list, get, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from sqlalchemy import select

from api.db.models import CalibrationProfileRow
from api.deps import ReadAccess, SessionDep, WriteAccess
from api.routers.responses import location, problems
from api.schemas.calibrations import CalibrationDetail, CalibrationPage, CalibrationSummary
from api.schemas.plans import MAX_ID
from api.services import calibrations as calibration_service
from planner.calibration import CalibrationProfile

router = APIRouter(prefix="/calibrations", tags=["calibrations"])

CalibrationId = Annotated[int, Path(ge=1, le=MAX_ID, description="A calibration profile's id")]


@router.post(
    "",
    status_code=201,
    response_model=CalibrationDetail,
    dependencies=[WriteAccess],
    responses=problems(401, 413, 415, 422),
    summary="Upload a CalibrationProfile (from `fsdp-planner calibrate`); it is validated and fitted",
)
def create_calibration(
    profile: CalibrationProfile, request: Request, response: Response, session: SessionDep
) -> CalibrationDetail:
    row = calibration_service.create_calibration(session, profile)
    response.headers["Location"] = location(request, "get_calibration", calibration_id=row.id)
    return CalibrationDetail.model_validate(row)


@router.get(
    "",
    response_model=CalibrationPage,
    dependencies=[ReadAccess],
    responses=problems(401, 422),
    summary="List calibration profiles, newest first",
)
def list_calibrations(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="`next_cursor` of the previous page")
    ] = None,
) -> CalibrationPage:
    query = select(CalibrationProfileRow).order_by(CalibrationProfileRow.id.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(CalibrationProfileRow.id < before)
    rows = list(session.scalars(query))
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return CalibrationPage(
        items=[CalibrationSummary.model_validate(r) for r in rows[:limit]], next_cursor=next_cursor
    )


@router.get(
    "/{calibration_id}",
    response_model=CalibrationDetail,
    dependencies=[ReadAccess],
    responses=problems(401, 404, 422),
    summary="Get a calibration profile with its measurements and fitted parameters",
)
def get_calibration(calibration_id: CalibrationId, session: SessionDep) -> CalibrationDetail:
    return CalibrationDetail.model_validate(calibration_service.get_calibration(session, calibration_id))


@router.delete(
    "/{calibration_id}",
    status_code=204,
    dependencies=[WriteAccess],
    responses=problems(401, 404, 409, 422),
    summary="Delete a calibration profile no stored plan uses",
)
def delete_calibration(calibration_id: CalibrationId, session: SessionDep) -> Response:
    calibration_service.delete_calibration(session, calibration_id)
    return Response(status_code=204)
