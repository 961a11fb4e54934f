"""What-if studies: plan every candidate cluster in parallel, store the plans and the study, read them back.

The searches run in the app's search pool (all cores), holding no database connection; then one
transaction stores each fitting cluster's plan as an ordinary plan (or finds it stored: plans are
deduplicated by their input hash), the study and its points.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, undefer

from api.db.inserts import insert_unless_taken, is_foreign_key_violation
from api.db.models import PlanRow, StudyPointRow, StudyRow
from api.problems import FieldError, ProblemError
from api.problems import summarize as summarize_errors
from api.schemas.studies import StudyCreate, StudyDetail, StudyPointOut, StudySummaryOut
from api.services import calibrations as calibration_service
from api.services import plans as plan_service
from api.services.search_pool import SearchJob, SearchPool, SearchPoolBrokenError
from planner import __version__ as planner_version
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.errors import PlanningError
from planner.plan import Plan
from planner.study import StudyPoint, StudyRequest, StudySummary, refused_point, study_point, summarize

SAVE_ATTEMPTS = 3
PICKS = ("fastest", "cheapest", "cheapest_within_deadline")
NON_FINITE = "the cost model produced non-finite numbers for this cluster (extreme sizes or bandwidths)"


def build_study(body: StudyCreate, *, max_model_layers: int) -> StudyRequest:
    """The planner's StudyRequest for an API body (the model resolved); refusals become 422 problems."""
    try:
        model = resolve_model(body.model)
        plan_service.check_model_size(model, max_model_layers)
        fields = {name: value for name, value in body if name in StudyRequest.model_fields}
        return StudyRequest(**{**fields, "model": model})
    except PlanningError as exc:
        raise plan_service.unplannable(exc) from None
    except ValidationError as exc:
        errors = plan_service.request_errors(exc)
        raise ProblemError(422, summarize_errors(errors), slug="invalid-request", title="Invalid request",
                           errors=errors) from None


def calibrations(session: Session, study: StudyRequest) -> dict[int, CalibrationProfile]:
    """The stored profiles the study's GPU types name, each checked against its GPU type."""
    profiles: dict[int, CalibrationProfile] = {}
    for index, gpu in enumerate(study.gpus):
        if gpu.calibration_id is None:
            continue
        field = f"gpus.{index}.calibration_id"
        row = calibration_service.find_calibration(session, gpu.calibration_id)
        if row is None:
            raise ProblemError(
                422, f"{field}: calibration profile {gpu.calibration_id} does not exist; upload one measured "
                f"on {gpu.name} (POST /api/v1/calibrations) or leave calibration_id out to plan with catalog "
                "peaks",
                slug="unknown-calibration", title="Unknown calibration profile",
                errors=[FieldError(location="body", field=field, message="no such calibration profile",
                                   type="not_found")],
            )
        profile = calibration_service.load_profile(row)
        try:
            calibration_service.check_matches_cluster(row, profile, gpu.name)
        except ProblemError as problem:
            problem.errors = [e.model_copy(update={"field": field}) for e in problem.errors or []]
            raise
        profiles[gpu.calibration_id] = profile
    return profiles


def run_study(
    study: StudyRequest, pool: SearchPool, *, profiles: dict[int, CalibrationProfile] | None = None,
    on_done: Callable[[int], None] | None = None,
) -> tuple[StudySummary, dict[int, Plan]]:
    """Search every candidate in parallel: the summary, and the plan of each fitting point by position."""
    candidates = study.candidates()
    jobs = {
        position: SearchJob(
            candidate.request,
            None if candidate.calibration_id is None else (profiles or {})[candidate.calibration_id],
            None if candidate.calibration_id is None else str(candidate.calibration_id),
        )
        for position, candidate in enumerate(candidates) if candidate.request is not None
    }
    results = pool.search_many(list(jobs.values()), on_done=on_done)
    outcomes: dict[int, Plan | PlanningError] = dict(zip(jobs, results, strict=True))
    points: list[StudyPoint] = []
    plans: dict[int, Plan] = {}
    for position, candidate in enumerate(candidates):
        outcome = outcomes.get(position)
        if isinstance(outcome, Plan) and plan_service.all_finite(outcome.model_dump(mode="json")):
            points.append(study_point(study, candidate, outcome))
            plans[position] = outcome
        elif isinstance(outcome, Plan):
            points.append(refused_point(candidate, PlanningError(NON_FINITE)))
        else:
            points.append(refused_point(candidate, outcome))
    return summarize(points, deadline_days=study.deadline_days), plans


def create_study(
    session: Session, body: StudyCreate, *, search_pool: SearchPool, max_model_layers: int
) -> int:
    """Plan and store a study; its id."""
    study = build_study(body, max_model_layers=max_model_layers)
    profiles = calibrations(session, study)
    session.commit()  # hold no connection while searching
    try:
        summary, plans = run_study(study, search_pool, profiles=profiles)
    except SearchPoolBrokenError:
        raise ProblemError(
            503, "a process searching this study stopped before answering (it may have run out of memory); "
            "nothing was stored: send the request again", slug="search-failed", title="Search failed",
            headers={"Retry-After": "1"},
        ) from None
    name = body.name or default_name(study)
    for _ in range(SAVE_ATTEMPTS):
        try:
            return save_study(session, study, summary, plans, name=name)
        except IntegrityError as error:
            session.rollback()
            if not is_foreign_key_violation(error):
                raise
            # A plan found stored was deleted before the study referred to it: store it again.
    raise ProblemError(
        409, "plans of this study were deleted while it was saved; send the request again",
        slug="concurrent-change", title="Concurrent change",
    )


def default_name(study: StudyRequest) -> str:
    return f"{study.model.name}, {_tokens(study.token_budget)} tokens"


def _tokens(count: int) -> str:
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(count)


def save_study(
    session: Session, study: StudyRequest, summary: StudySummary, plans: dict[int, Plan], *, name: str
) -> int:
    """One transaction: the fitting clusters' plans (found or inserted), the study, its points."""
    plan_ids: dict[int, int] = {}
    candidates = study.candidates()
    for position, plan in plans.items():
        request = candidates[position].request
        assert request is not None  # only searched candidates have plans
        label = f"{name}: {candidates[position].label}"
        row = plan_service.row_for(request, plan, plan.plan_hash, name=label,
                                   calibration_id=candidates[position].calibration_id)
        values = {c.key: getattr(row, c.key) for c in PlanRow.__table__.columns
                  if c.key not in ("id", "created_at")}
        plan_id = insert_unless_taken(session, PlanRow, values, unique="plan_hash")
        if plan_id is None:
            plan_id = session.scalar(select(PlanRow.id).where(PlanRow.plan_hash == plan.plan_hash))
        assert plan_id is not None  # stored, or stored before (a delete since fails the commit)
        plan_ids[position] = plan_id
    row = StudyRow(
        name=name, model_name=study.model.name, token_budget=study.token_budget,
        deadline_days=study.deadline_days, gpus=",".join(gpu.name for gpu in study.gpus),
        num_candidates=len(summary.points), num_fitting=sum(p.fits for p in summary.points),
        planner_version=planner_version, request=study.model_dump(mode="json"),
        summary=summary.model_dump(mode="json", exclude={"points"}),
    )
    session.add(row)
    session.flush()
    session.add_all(
        StudyPointRow(study_id=row.id, position=position, plan_id=plan_ids.get(position),
                      point=point.model_dump(mode="json"))
        for position, point in enumerate(summary.points)
    )
    session.commit()
    return row.id


def summary_of(row: StudyRow) -> StudySummaryOut:
    return StudySummaryOut(
        id=row.id, name=row.name, model_name=row.model_name, token_budget=row.token_budget,
        deadline_days=row.deadline_days, gpus=row.gpus.split(","), num_candidates=row.num_candidates,
        num_fitting=row.num_fitting, planner_version=row.planner_version, created_at=row.created_at,
    )


def get_study(session: Session, study_id: int) -> StudyDetail:
    row = session.scalar(select(StudyRow).where(StudyRow.id == study_id).options(undefer(StudyRow.request)))
    if row is None:
        raise study_not_found(study_id)
    point_rows = session.scalars(
        select(StudyPointRow).where(StudyPointRow.study_id == study_id).order_by(StudyPointRow.position)
    ).all()
    points = []
    for point_row in point_rows:
        point = StudyPoint.model_validate(point_row.point)
        points.append(StudyPointOut(**point.model_dump(), position=point_row.position, cluster=point.label,
                                    plan_id=point_row.plan_id))
    picks: dict[str, Any] = {key: row.summary.get(key) for key in PICKS}
    return StudyDetail(**summary_of(row).model_dump(), request=row.request, points=points, **picks)


def list_studies(
    session: Session, *, limit: int, cursor: int | None
) -> tuple[list[StudySummaryOut], str | None]:
    """Newest first; keyset pagination on the id (ids only grow)."""
    query = select(StudyRow).order_by(StudyRow.id.desc()).limit(limit + 1)
    if cursor is not None:
        query = query.where(StudyRow.id < cursor)
    rows = session.scalars(query).all()
    next_cursor = str(rows[limit - 1].id) if len(rows) > limit else None
    return [summary_of(row) for row in rows[:limit]], next_cursor


def delete_study(session: Session, study_id: int) -> None:
    """Delete a study and its points; its plans stay (they are ordinary plans, maybe shared)."""
    deleted = session.execute(delete(StudyRow).where(StudyRow.id == study_id).returning(StudyRow.id)).first()
    if deleted is None:
        raise study_not_found(study_id)
    session.commit()


def study_not_found(study_id: int) -> ProblemError:
    return ProblemError(404, f"there is no study {study_id}; list studies with GET /api/v1/studies",
                        slug="study-not-found", title="Study not found",
                        errors=[FieldError(location="path", field="study_id", message="no such study",
                                           type="not_found")])
