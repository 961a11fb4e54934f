"""/plans/{id}/launcher: the plan's launch bundle (torchrun, SLURM, Kubernetes) as one archive."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Response
from sqlalchemy import select

from api.db.models import PlanRow
from api.deps import ReadAccess, SessionDep
from api.problems import FieldError, ProblemError
from api.routers.responses import problems
from api.schemas.plans import PlanId
from api.services import plans as plan_service
from executor.launch.bundle import DEFAULT_IMAGE, MEDIA_TYPES, archive_filename, build_bundle
from executor.launch.quoting import IMAGE_PATTERN, UnsafeValueError
from planner.plan import Plan

router = APIRouter(prefix="/plans/{plan_id}/launcher", tags=["launchers"])


class LaunchTarget(StrEnum):
    torchrun = "torchrun"
    slurm = "slurm"
    k8s = "k8s"
    all = "all"


class ArchiveFormat(StrEnum):
    tar_gz = "tar.gz"
    zip = "zip"


@router.get(
    "",
    dependencies=[ReadAccess],
    response_class=Response,
    responses={
        200: {
            "description": "The bundle: plan.json, the runtime package, launch scripts and a README",
            "content": {
                media: {"schema": {"type": "string", "format": "binary"}} for media in MEDIA_TYPES.values()
            },
        },
        **problems(401, 404, 422),
    },
    summary="Download the plan's launch bundle",
)
def download_launcher(
    plan_id: PlanId,
    session: SessionDep,
    target: Annotated[LaunchTarget, Query(description="Which launchers to include")] = LaunchTarget.all,
    archive_format: Annotated[
        ArchiveFormat, Query(alias="format", description="Archive format")
    ] = ArchiveFormat.tar_gz,
    image: Annotated[
        str,
        Query(
            min_length=1, max_length=255, pattern=IMAGE_PATTERN,
            description="Container image for the Kubernetes manifests (a plain image reference)",
        ),
    ] = DEFAULT_IMAGE,
) -> Response:
    row = session.scalar(select(PlanRow).where(PlanRow.id == plan_id).options(*plan_service.full_plan()))
    if row is None:
        raise plan_service.plan_not_found(plan_id)
    plan = Plan.model_validate(row.plan)
    try:
        archive = build_bundle(plan, target=target.value, fmt=archive_format.value, image=image)
    except UnsafeValueError as exc:
        raise ProblemError(
            422,
            f"image: {exc}",
            slug="invalid-request",
            title="Invalid request",
            errors=[FieldError(location="query", field="image", message=str(exc), type="value_error")],
        ) from None
    filename = archive_filename(plan, fmt=archive_format.value)
    return Response(
        content=archive,
        media_type=MEDIA_TYPES[archive_format.value],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
