"""Database reads the dashboard needs beyond the plan listing (which `api.services.plan_listing` does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, undefer

from api.db.models import (
    CalibrationProfileRow,
    PlanRow,
    StudyPointRow,
    StudyRow,
    ValidationRunRow,
    mesh_degree,
)
from api.services.plan_listing import PlanFilters
from api.services.plans import full_plan
from contract.mesh import MESH_AXES

# The accuracy page plots every run up to this many (newest first); beyond it a scatter is unreadable
# and the page slow, so it says how many were left out.
MAX_ACCURACY_RUNS = 5000
CALIBRATIONS_PER_PAGE = 50


def plan_with_documents(session: Session, plan_id: int) -> PlanRow | None:
    return session.scalar(select(PlanRow).where(PlanRow.id == plan_id).options(*full_plan()))


def studies_of_plan(session: Session, plan_id: int) -> list[tuple[int, str]]:
    """(id, name) of the studies a plan is a point of, newest first."""
    query = (select(StudyRow.id, StudyRow.name).join(StudyPointRow, StudyPointRow.study_id == StudyRow.id)
             .where(StudyPointRow.plan_id == plan_id).distinct().order_by(StudyRow.id.desc()))
    return [(row.id, row.name) for row in session.execute(query)]


def count_plans(session: Session, filters: PlanFilters) -> int:
    return session.scalar(select(func.count()).select_from(PlanRow).where(*filters.conditions())) or 0


@dataclass(frozen=True)
class FilterChoices:
    """What stored plans use: the list page's filter choices."""

    models: list[str]
    gpus: list[str]
    degrees: dict[str, list[int]]
    """Each mesh axis (`MESH_AXES`) -> the degrees stored plans have on it, ascending."""


def distinct_values(session: Session) -> FilterChoices:
    def distinct(column: Any) -> list[Any]:
        return list(session.scalars(select(column).distinct().order_by(column)))

    # One query for every axis: the distinct meshes are few, however many plans share them.
    meshes = session.execute(select(*(mesh_degree(axis) for axis in MESH_AXES)).distinct()).all()
    degrees = {axis: sorted({mesh[i] for mesh in meshes}) for i, axis in enumerate(MESH_AXES)}
    return FilterChoices(distinct(PlanRow.model_name), distinct(PlanRow.gpu), degrees)


def validation_runs(session: Session, plan_id: int) -> list[ValidationRunRow]:
    return list(session.scalars(
        select(ValidationRunRow).where(ValidationRunRow.plan_id == plan_id)
        .order_by(ValidationRunRow.created_at.desc(), ValidationRunRow.id.desc())
    ))


@dataclass(frozen=True)
class RunWithPlan:
    run: ValidationRunRow
    plan_name: str
    model_name: str
    gpu: str


def all_validation_runs(session: Session) -> tuple[list[RunWithPlan], int]:
    """The newest completed runs (up to MAX_ACCURACY_RUNS) with their plans' labels, and how many exist.

    Out-of-memory runs measured no step to compare with a prediction: they are left out.
    """
    completed = ValidationRunRow.outcome == "completed"
    total = session.scalar(select(func.count()).select_from(ValidationRunRow).where(completed)) or 0
    rows = session.execute(
        select(ValidationRunRow, PlanRow.name, PlanRow.model_name, PlanRow.gpu)
        .join(PlanRow, PlanRow.id == ValidationRunRow.plan_id)
        .where(completed)
        .order_by(ValidationRunRow.created_at.desc(), ValidationRunRow.id.desc())
        .limit(MAX_ACCURACY_RUNS)
    )
    return [RunWithPlan(run, name, model, gpu) for run, name, model, gpu in rows], total


def calibration_page(session: Session, page: int) -> tuple[list[CalibrationProfileRow], int]:
    """One page of calibration profiles, newest first (without their large documents), and the total."""
    total = session.scalar(select(func.count()).select_from(CalibrationProfileRow)) or 0
    rows = session.scalars(
        select(CalibrationProfileRow)
        .order_by(CalibrationProfileRow.created_at.desc(), CalibrationProfileRow.id.desc())
        .offset((page - 1) * CALIBRATIONS_PER_PAGE).limit(CALIBRATIONS_PER_PAGE)
    )
    return list(rows), total


def calibration_choices(session: Session) -> list[CalibrationProfileRow]:
    """Every profile, newest first, for the new-plan form's select (documents not loaded)."""
    return list(session.scalars(
        select(CalibrationProfileRow).order_by(CalibrationProfileRow.created_at.desc(),
                                               CalibrationProfileRow.id.desc())
    ))


def calibration_with_profile(session: Session, calibration_id: int) -> CalibrationProfileRow | None:
    return session.scalar(
        select(CalibrationProfileRow).where(CalibrationProfileRow.id == calibration_id)
        .options(undefer(CalibrationProfileRow.profile))
    )


def plans_using_calibration(session: Session, calibration_id: int) -> list[PlanRow]:
    return list(session.scalars(
        select(PlanRow).where(PlanRow.calibration_id == calibration_id).order_by(PlanRow.id.desc()).limit(50)
    ))
