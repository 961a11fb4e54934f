"""Calibration profiles: validate an uploaded profile, fit the cost model to it, store and load it."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, undefer

from api.db.models import CalibrationProfileRow, PlanRow
from api.problems import FieldError, ProblemError
from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.cost.parameters import default_parameters
from planner.errors import PlanningError
from planner.specs import ClusterSpec


def fitted_parameters(profile: CalibrationProfile) -> dict[str, dict]:
    """The cost parameters the profile yields, per precision, beside the catalog defaults they replace."""
    gpu = _catalog_gpu(profile)
    fingerprint = profile.fingerprint
    cluster = ClusterSpec(num_nodes=fingerprint.num_nodes, gpus_per_node=fingerprint.gpus_per_node, gpu=gpu)
    out: dict[str, dict] = {}
    for precision in ("bf16", "fp32"):
        base = default_parameters(resolve_gpu(gpu), cluster, precision)
        out[precision] = fit_parameters(profile, base=base, precision=precision).as_document()
        out[f"{precision}_catalog"] = base.as_document()
    return out


def create_calibration(session: Session, profile: CalibrationProfile) -> CalibrationProfileRow:
    profile = with_catalog_gpu(profile)
    fitted = fitted_parameters(profile)
    row = CalibrationProfileRow(
        name=profile.name or f"{profile.fingerprint.device_name} x{profile.fingerprint.device_count}",
        fingerprint=profile.fingerprint.model_dump(mode="json"),
        profile=profile.model_dump(mode="json"),
        fitted_parameters=fitted,
    )
    session.add(row)
    session.commit()
    return row


def with_catalog_gpu(profile: CalibrationProfile) -> CalibrationProfile:
    """The profile with its `gpu` named: as sent, or derived from the device name it was measured on.

    The fit starts from the catalog GPU's datasheet peaks, and plans check the profile against the
    cluster's GPU, so a stored profile always names one.
    """
    if profile.gpu is not None:
        return profile
    device = profile.fingerprint.device_name
    gpu = profile.catalog_gpu()
    if gpu is None:
        raise ProblemError(
            422,
            f"the profile has no `gpu`, and its device {device!r} (fingerprint.device_name) is not a GPU of "
            "the catalog; set `gpu` to the catalog GPU (GET /api/v1/gpus) whose datasheet peaks the fit "
            "should start from",
            slug="invalid-calibration",
            title="Invalid calibration profile",
            errors=[
                FieldError(location="body", field="gpu", type="missing",
                           message=f"missing, and device {device!r} is not a catalog GPU")
            ],
        )
    return profile.model_copy(update={"gpu": gpu.name})


def find_calibration(session: Session, calibration_id: int) -> CalibrationProfileRow | None:
    """The stored profile with its (deferred) measurements loaded, or None."""
    return session.scalar(
        select(CalibrationProfileRow)
        .where(CalibrationProfileRow.id == calibration_id)
        .options(undefer(CalibrationProfileRow.profile))
    )


def get_calibration(session: Session, calibration_id: int) -> CalibrationProfileRow:
    row = find_calibration(session, calibration_id)
    if row is None:
        raise ProblemError(
            404,
            f"calibration profile {calibration_id} does not exist; list them with GET /api/v1/calibrations",
            slug="calibration-not-found",
            title="Calibration profile not found",
        )
    return row


def load_profile(row: CalibrationProfileRow) -> CalibrationProfile:
    try:
        return CalibrationProfile.model_validate(row.profile)
    except ValidationError:  # stored by an older schema: say so instead of failing obscurely
        raise ProblemError(
            422,
            f"calibration profile {row.id} was stored in a format this version cannot read; upload it again",
            slug="stale-calibration",
            title="Unreadable calibration profile",
        ) from None


def check_matches_cluster(row: CalibrationProfileRow, profile: CalibrationProfile, gpu: str) -> None:
    """A profile describes one GPU type: planning another with it would be silently wrong."""
    measured = _catalog_gpu(profile)
    if resolve_gpu(measured).name != gpu:
        raise ProblemError(
            422,
            f"calibration profile {row.id} was measured on {measured}, but the cluster has {gpu}; "
            f"plan for {measured} or upload a profile measured on {gpu}",
            slug="calibration-mismatch",
            title="Calibration does not match the cluster",
            errors=[
                FieldError(
                    location="body",
                    field="calibration_id",
                    message=f"measured on {measured}, not {gpu}",
                    type="mismatch",
                )
            ],
        )


def delete_calibration(session: Session, calibration_id: int) -> None:
    row = get_calibration(session, calibration_id)
    users = session.scalar(select(func.count()).select_from(PlanRow).where(PlanRow.calibration_id == row.id))
    if users:
        raise ProblemError(
            409,
            f"calibration profile {row.id} is used by {users} stored plan(s); delete those plans first "
            f"(GET /api/v1/plans lists them) so that no plan loses the record of what it was fitted to",
            slug="calibration-in-use",
            title="Calibration profile in use",
        )
    session.delete(row)
    session.commit()


def _catalog_gpu(profile: CalibrationProfile) -> str:
    try:
        if profile.gpu is None:
            raise PlanningError("missing")
        return resolve_gpu(profile.gpu).name
    except PlanningError:
        raise ProblemError(
            422,
            f"the profile's `gpu` ({profile.gpu!r}) must name a GPU of the catalog (GET /api/v1/gpus) so "
            "the fit has datasheet peaks to start from; the profiler fills it in for known devices",
            slug="invalid-calibration",
            title="Invalid calibration profile",
            errors=[
                FieldError(location="body", field="gpu", message="not a catalog GPU", type="value_error")
            ],
        ) from None
