"""/plans/{id}/launcher: the plan's launch bundle (torchrun, SLURM, Kubernetes, SkyPilot; or the plan as a
torchtitan job) as one archive."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import StringConstraints
from sqlalchemy import select

from api.db.models import PlanRow
from api.deps import ReadAccess, SessionDep
from api.problems import FieldError, ProblemError
from api.routers.responses import problems
from api.schemas.plans import PlanId
from api.services import calibrations as calibration_service
from api.services import plans as plan_service
from executor.launch.bundle import (
    DEFAULT_CUDA_VERSION,
    DEFAULT_ROCM_VERSION,
    DEFAULT_TORCH_VERSION,
    MEDIA_TYPES,
    BundleTooLargeError,
    PodOptions,
    archive_filename,
    build_bundle,
)
from executor.launch.quoting import (
    CUDA_VERSION_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    IMAGE_PATTERN,
    NODE_SELECTOR_PATTERN,
    QUEUE_PATTERN,
    RESOURCE_PATTERN,
    ROCM_VERSION_PATTERN,
    TOLERATION_PATTERN,
    TORCH_VERSION_PATTERN,
    UnsafeValueError,
)
from executor.launch.torchtitan import DEFAULT_SERIES, TORCHTITAN_RELEASES, NotOnTorchtitanError
from planner.plan import Plan

router = APIRouter(prefix="/plans/{plan_id}/launcher", tags=["launchers"])


class LaunchTarget(StrEnum):
    torchrun = "torchrun"
    slurm = "slurm"
    k8s = "k8s"
    skypilot = "skypilot"
    all = "all"
    torchtitan = "torchtitan"


class GpuResource(StrEnum):
    nvidia = "nvidia.com/gpu"
    amd = "amd.com/gpu"


TorchtitanSeries = StrEnum(  # type: ignore[misc]
    "TorchtitanSeries", {f"v{series.replace('.', '_')}": series for series in TORCHTITAN_RELEASES}
)
"""The torchtitan series a torchtitan bundle can be written for (executor/launch/torchtitan.py's)."""


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
        str | None,
        Query(
            min_length=1, max_length=255, pattern=IMAGE_PATTERN,
            description="Container image for the Kubernetes manifests (a plain image reference); "
            "default: the plan's GPU vendor's PyTorch image, PyTorch's official one for torch_version and "
            "cuda_version, or AMD's ROCm one (rocm/pytorch) for torch_version and rocm_version",
        ),
    ] = None,
    torch_version: Annotated[
        str,
        Query(
            max_length=20, pattern=TORCH_VERSION_PATTERN,
            description="The torch the Kubernetes image carries "
            "(pytorch/pytorch:<torch>-cuda<cuda>-cudnn9-runtime)",
        ),
    ] = DEFAULT_TORCH_VERSION,
    cuda_version: Annotated[
        str, Query(max_length=10, pattern=CUDA_VERSION_PATTERN, description="The CUDA of that image")
    ] = DEFAULT_CUDA_VERSION,
    rocm_version: Annotated[
        str,
        Query(max_length=10, pattern=ROCM_VERSION_PATTERN, description="The ROCm of the image for AMD GPUs"),
    ] = DEFAULT_ROCM_VERSION,
    rdma_resource: Annotated[
        str | None,
        Query(
            min_length=3, max_length=253, pattern=RESOURCE_PATTERN,
            description="Extended resource of the cluster's RDMA device plugin, requested by every pod "
            "(e.g. rdma/rdma_shared_device_a); default: a commented-out block",
        ),
    ] = None,
    rdma_count: Annotated[int, Query(ge=1, le=64, description="RDMA resources per pod")] = 1,
    queue: Annotated[
        str | None,
        Query(
            min_length=1, max_length=63, pattern=QUEUE_PATTERN,
            description="Kueue LocalQueue of the Kubernetes job (its kueue.x-k8s.io/queue-name label; "
            "the job is created suspended until Kueue admits it)",
        ),
    ] = None,
    node_selector: Annotated[
        list[Annotated[str, StringConstraints(max_length=253, pattern=NODE_SELECTOR_PATTERN)]] | None,
        Query(max_length=16, description="KEY=VALUE a pod's node must carry (repeat it for several)"),
    ] = None,
    toleration: Annotated[
        list[Annotated[str, StringConstraints(max_length=253, pattern=TOLERATION_PATTERN)]] | None,
        Query(
            max_length=16,
            description="Taint the pods tolerate, KEY[=VALUE][:EFFECT] (e.g. nvidia.com/gpu:NoSchedule; "
            "repeat the parameter for several)",
        ),
    ] = None,
    priority_class: Annotated[
        str | None,
        Query(
            min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
            description="PriorityClass of the pods",
        ),
    ] = None,
    torchtitan_version: Annotated[
        TorchtitanSeries,
        Query(description="target torchtitan: the torchtitan series the job config is written for: 0.3 (its "
              "Python config module, torchtitan 0.3.0) or 0.2 (its TOML job config, torchtitan 0.2.2)"),
    ] = TorchtitanSeries(DEFAULT_SERIES),
    gpu_resource: Annotated[
        GpuResource | None,
        Query(description="The GPUs' resource name; default: the plan's GPU vendor's (amd.com/gpu for AMD "
              "Instinct, else nvidia.com/gpu). Another vendor's needs an image with its build of torch"),
    ] = None,
) -> Response:
    row = session.scalar(select(PlanRow).where(PlanRow.id == plan_id).options(*plan_service.full_plan()))
    if row is None:
        raise plan_service.plan_not_found(plan_id)
    plan = Plan.model_validate(row.plan)
    calibration = None
    if target is LaunchTarget.torchtitan and row.calibration_id is not None:
        # The torchtitan bundle re-prices the plan as torchtitan runs it, under the plan's own profile.
        calibration = calibration_service.load_profile(
            calibration_service.get_calibration(session, row.calibration_id)
        )
    try:
        archive = build_bundle(
            plan,
            target=target.value,
            fmt=archive_format.value,
            pods=PodOptions(
                image=image, torch_version=torch_version, cuda_version=cuda_version,
                rocm_version=rocm_version, rdma_resource=rdma_resource, rdma_count=rdma_count, queue=queue,
                node_selector=tuple(node_selector or ()), tolerations=tuple(toleration or ()),
                priority_class=priority_class, gpu_resource=gpu_resource.value if gpu_resource else None,
            ),
            calibration=calibration,
            torchtitan_version=torchtitan_version.value,
        )
    except UnsafeValueError as exc:
        field = exc.field or "image"
        raise ProblemError(
            422,
            f"{field}: {exc}",
            slug="invalid-request",
            title="Invalid request",
            errors=[FieldError(location="query", field=field, message=str(exc), type="value_error")],
        ) from None
    except (BundleTooLargeError, NotOnTorchtitanError) as exc:
        raise ProblemError(
            422,
            f"target: {exc}",
            slug="invalid-request",
            title="Invalid request",
            errors=[FieldError(location="query", field="target", message=str(exc), type="value_error")],
        ) from None
    filename = archive_filename(
        plan, fmt=archive_format.value, target=target.value, torchtitan_version=torchtitan_version.value
    )
    return Response(
        content=archive,
        media_type=MEDIA_TYPES[archive_format.value],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
