"""What-if studies as jobs: submit (check the inputs, store a queued study), run the job (plan every
candidate cluster in parallel, store the plans and the points), cancel, read them back.

A study's job runs apart from the request that submitted it (api/services/jobs.py runs it, in the web
process for the embedded default). Its searches run in the jobs' own search pool, holding no database
connection, so that a small `POST /plans` never queues behind a study's candidates; then one
transaction stores each fitting cluster's plan as an ordinary plan (or finds it stored: plans are
deduplicated by their input hash) and the study's points. State and progress live on the study's row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker, undefer

from api.db.base import utcnow
from api.db.inserts import insert_unless_taken, is_foreign_key_violation
from api.db.models import PlanRow, StudyPointRow, StudyRow
from api.problems import FieldError, ProblemError
from api.problems import summarize as summarize_errors
from api.schemas.studies import (
    UNFINISHED,
    StudyCreate,
    StudyDetail,
    StudyPointOut,
    StudyState,
    StudySummaryOut,
)
from api.services import calibrations as calibration_service
from api.services import job_rows
from api.services import plans as plan_service
from api.services.job_rows import JobEnd
from api.services.keyed_locks import KeyedLocks
from api.services.search_pool import SearchJob, SearchPool, SearchPoolBrokenError
from planner import __version__ as planner_version
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.errors import PlanningError
from planner.plan import Plan
from planner.study import (
    StudyCandidate,
    StudyPoint,
    StudyRequest,
    StudySummary,
    refused_point,
    study_point,
    summarize,
)

SAVE_ATTEMPTS = 3
PICKS = ("fastest", "cheapest", "cheapest_within_deadline")
NON_FINITE = "the cost model produced non-finite numbers for this cluster (extreme sizes or bandwidths)"
PROGRESS_INTERVAL_S = 0.5
"""A running study writes its progress (and learns whether it was cancelled) at most this often."""
log = logging.getLogger(__name__)


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
    on_done: Callable[[int], None] | None = None, on_point: Callable[[int, StudyPoint], None] | None = None,
) -> tuple[StudySummary, dict[int, Plan]]:
    """Search every candidate in parallel: the summary, and the plan of each fitting point by position.

    `on_done(count)` follows the searches; `on_point(position, point)` gets each candidate's outcome as
    it is known (those refused before searching first). An exception they raise stops the study.
    """
    candidates = study.candidates()
    jobs = {
        position: SearchJob(
            candidate.request,
            None if candidate.calibration_id is None else (profiles or {})[candidate.calibration_id],
            None if candidate.calibration_id is None else str(candidate.calibration_id),
            advise_other_clusters=False,  # the study's own sizes say which clusters fit
        )
        for position, candidate in enumerate(candidates) if candidate.request is not None
    }
    positions = list(jobs)
    if on_point is not None:
        for position, candidate in enumerate(candidates):
            if candidate.request is None:
                on_point(position, refused_point(candidate))

    def outcome_point(index: int, outcome: Plan | PlanningError) -> None:
        if on_point is not None:
            position = positions[index]
            on_point(position, _point(study, candidates[position], outcome))

    results = pool.search_many(list(jobs.values()), on_done=on_done, on_result=outcome_point)
    outcomes: dict[int, Plan | PlanningError] = dict(zip(jobs, results, strict=True))
    points: list[StudyPoint] = []
    plans: dict[int, Plan] = {}
    for position, candidate in enumerate(candidates):
        outcome = outcomes.get(position)
        points.append(_point(study, candidate, outcome))
        if isinstance(outcome, Plan) and points[-1].fits:
            plans[position] = outcome
    return summarize(points, deadline_days=study.deadline_days), plans


def _point(
    study: StudyRequest, candidate: StudyCandidate, outcome: Plan | PlanningError | None
) -> StudyPoint:
    if isinstance(outcome, Plan) and plan_service.all_finite(outcome.model_dump(mode="json")):
        return study_point(study, candidate, outcome)
    if isinstance(outcome, Plan):
        return refused_point(candidate, PlanningError(NON_FINITE))
    return refused_point(candidate, outcome)


@dataclass(frozen=True)
class Submission:
    study_id: int
    replayed: bool = False
    """True when an Idempotency-Key named a study submitted before (this request stored nothing)."""


def submit_study(
    session: Session, body: StudyCreate, *, locks: KeyedLocks, max_model_layers: int,
    idempotency_key: str | None = None, idempotency_ttl_s: int = 24 * 3600,
    enqueue: Callable[[Session, int], None] | None = None,
) -> Submission:
    """Check a study's inputs (422s now, not in the job) and store it as a queued job; nothing is searched
    here. With a key, the study submitted before with it is the answer (another body: 422).

    `enqueue(session, study_id)` runs in the transaction that stores the study, before its commit (a task
    engine's job for it is stored with it, or neither is); a replayed study enqueues nothing."""
    claim = None if idempotency_key is None else plan_service.KeyClaim(
        key=idempotency_key, fingerprint=plan_service.fingerprint(body), ttl_s=idempotency_ttl_s
    )
    # In this process, requests with one key take turns; between processes the key's unique index decides.
    with locks.hold(f"study-idempotency-key:{idempotency_key}") if claim is not None else nullcontext():
        if claim is not None:
            replay = _replay(session, claim)
            if replay is not None:
                return replay
        study = build_study(body, max_model_layers=max_model_layers)
        calibrations(session, study)
        values = {
            "name": body.name or default_name(study), "model_name": study.model.name,
            "token_budget": study.token_budget, "deadline_days": study.deadline_days,
            "gpus": ",".join(gpu.series for gpu in study.gpus), "num_candidates": len(study.candidates()),
            "num_fitting": 0, "planner_version": planner_version, "request": study.model_dump(mode="json"),
            "summary": {}, "candidates_done": 0,
        }
        study_id, replayed = job_rows.store_queued(session, StudyRow, values, claim, enqueue)
        return Submission(study_id, replayed=replayed)


def _replay(session: Session, claim: plan_service.KeyClaim) -> Submission | None:
    """The study submitted with `claim`'s key (a 422 problem for another body), or None while it is free."""
    study_id = job_rows.keyed_job(session, StudyRow, claim)
    return None if study_id is None else Submission(study_id, replayed=True)


class StudyStoppedError(Exception):
    """The study was cancelled or deleted while it ran: its job ends and stores nothing."""


class JobInterruptedError(Exception):
    """The process running the job is shutting down: the study goes back to the queue."""


class _Progress:
    """A running study's progress, written to its row at most every PROGRESS_INTERVAL_S; each write also
    learns whether the study was cancelled or deleted meanwhile (then StudyStoppedError)."""

    def __init__(
        self, session_factory: sessionmaker[Session], study_id: int, attempt: int, stopping: threading.Event
    ):
        self.session_factory = session_factory
        self.study_id = study_id
        self.attempt = attempt
        self.stopping = stopping
        self.done = 0
        self.fitting = 0
        self.best: StudyPoint | None = None
        self.written_at = 0.0

    def point(self, _position: int, point: StudyPoint) -> None:
        self.done += 1
        if point.fits:
            self.fitting += 1
            if point.cost is not None and (self.best is None or self.best.cost is None
                                           or point.cost < self.best.cost):
                self.best = point
        if self.stopping.is_set():
            raise JobInterruptedError
        if time.monotonic() - self.written_at >= PROGRESS_INTERVAL_S:
            self.write()

    def write(self) -> None:
        with self.session_factory() as session:
            written = session.execute(update(StudyRow).where(*_ours(self.study_id, self.attempt)).values(
                candidates_done=self.done, num_fitting=self.fitting, heartbeat_at=utcnow(),
                best_so_far=None if self.best is None else self.best.model_dump(mode="json"),
            ).returning(StudyRow.id)).first()
            session.commit()
        self.written_at = time.monotonic()
        if written is None:
            raise StudyStoppedError


def run_study_job(
    session_factory: sessionmaker[Session], study_id: int, *, search_pool: SearchPool,
    stopping: threading.Event, take_over: bool = False,
) -> JobEnd:
    """The job of one study: claim it (queued -> running), search every candidate, store the plans and
    points (running -> succeeded), or record why it failed. A study cancelled or deleted meanwhile stops
    at its next progress write and stores nothing; `stopping` (shutdown) puts it back in the queue.

    `take_over`: also claim a study left `running` by an earlier attempt whose process died (the task
    engine, which knows that no other job of this study runs, says so); the new attempt number keeps the
    old attempt, should it wake, from storing anything."""
    claimable = (StudyState.queued, StudyState.running) if take_over else (StudyState.queued,)
    with session_factory() as session:
        now = utcnow()
        claimed = session.execute(update(StudyRow).where(
            StudyRow.id == study_id, StudyRow.state.in_(claimable)
        ).values(state=StudyState.running, started_at=now, heartbeat_at=now, attempts=StudyRow.attempts + 1,
                 candidates_done=0, num_fitting=0, best_so_far=None).returning(StudyRow.attempts)).first()
        session.commit()
        if claimed is None:  # cancelled, deleted, or taken by another process
            return JobEnd.not_claimed
        attempt = claimed.attempts
        try:
            row = session.scalar(select(StudyRow).where(StudyRow.id == study_id)
                                 .options(undefer(StudyRow.request)))
            if row is None:
                return JobEnd.finished  # deleted in between
            study = StudyRequest.model_validate(row.request)
            name = row.name
            profiles = calibrations(session, study)
            session.commit()  # hold no connection while searching
            progress = _Progress(session_factory, study_id, attempt, stopping)
            summary, plans = run_study(study, search_pool, profiles=profiles, on_point=progress.point)
            _finish(session, study_id, attempt, study, summary, plans, name=name)
        except StudyStoppedError:
            session.rollback()
        except JobInterruptedError:
            session.rollback()
            _set_state(session, study_id, attempt, StudyState.queued, started_at=None)
            return JobEnd.requeued
        except ProblemError as problem:  # a calibration deleted or changed since the submission
            session.rollback()
            _fail(session, study_id, attempt, problem.detail)
        except SearchPoolBrokenError:
            session.rollback()
            _fail(session, study_id, attempt, "a process searching this study stopped before answering "
                  "(it may have run out of memory); submit the study again, with fewer or smaller "
                  "candidates if it recurs")
        except Exception as error:  # a bug: the study says it failed instead of staying 'running'
            log.exception("study %s failed", study_id)
            session.rollback()
            _fail(session, study_id, attempt,
                  f"internal error ({type(error).__name__}); the server log has the details")
        return JobEnd.finished


def _ours(study_id: int, attempt: int) -> tuple[Any, ...]:
    """The study is still running this job's attempt: not cancelled, deleted, or queued again since."""
    return StudyRow.id == study_id, StudyRow.state == StudyState.running, StudyRow.attempts == attempt


def _fail(session: Session, study_id: int, attempt: int, reason: str) -> None:
    _set_state(session, study_id, attempt, StudyState.failed, error=reason, finished_at=utcnow())


def _set_state(session: Session, study_id: int, attempt: int, state: StudyState, **values: Any) -> None:
    """Move the study this job runs to `state` (one cancelled, deleted or queued again meanwhile stays)."""
    session.execute(update(StudyRow).where(*_ours(study_id, attempt)).values(state=state, **values))
    session.commit()


def _finish(
    session: Session, study_id: int, attempt: int, study: StudyRequest, summary: StudySummary,
    plans: dict[int, Plan], *, name: str,
) -> None:
    for _ in range(SAVE_ATTEMPTS):
        try:
            save_study(session, study_id, attempt, study, summary, plans, name=name)
            return
        except IntegrityError as error:
            session.rollback()
            if not is_foreign_key_violation(error):
                raise
            # A plan found stored was deleted before the study referred to it: store it again.
    raise _concurrent_change()


def _concurrent_change() -> ProblemError:
    return ProblemError(
        409, "plans of this study were deleted while it was saved; send the request again",
        slug="concurrent-change", title="Concurrent change",
    )


def cancel_study(session: Session, study_id: int) -> None:
    """Stop a queued or running study (its job stores nothing); a finished one is answered with 409."""
    cancelled = session.execute(update(StudyRow).where(
        StudyRow.id == study_id, StudyRow.state.in_(UNFINISHED)
    ).values(state=StudyState.cancelled, finished_at=utcnow()).returning(StudyRow.id)).first()
    session.commit()
    if cancelled is not None:
        return
    state = session.scalar(select(StudyRow.state).where(StudyRow.id == study_id))
    session.commit()
    if state is None:
        raise study_not_found(study_id)
    if state != StudyState.cancelled:  # cancelling twice is fine
        raise ProblemError(409, f"study {study_id} has {state} already; only a queued or running study can "
                           "be cancelled (DELETE removes a finished one)", slug="study-finished",
                           title="Study already finished")


def beat(session: Session, study_ids: Collection[int]) -> None:
    """Say that this process still runs these studies."""
    job_rows.beat(session, StudyRow, study_ids)


def requeue_stale(session: Session, *, stale_after_s: float) -> list[int]:
    """Queue again the running studies whose process has been silent for `stale_after_s`: their ids."""
    return job_rows.requeue_stale(session, StudyRow, stale_after_s=stale_after_s)


def give_up(session: Session, study_id: int, reason: str) -> bool:
    """Fail a queued or running study whose job will not run again; whether it was unfinished."""
    return job_rows.give_up(session, StudyRow, study_id, reason)


def queued_studies(session: Session) -> list[int]:
    """Ids of the studies waiting for a job, oldest first (resubmitted when a web process starts)."""
    return job_rows.queued(session, StudyRow)


def default_name(study: StudyRequest) -> str:
    return f"{study.model.name}, {_tokens(study.token_budget)} tokens"


def _tokens(count: int) -> str:
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(count)


def save_study(
    session: Session, study_id: int, attempt: int, study: StudyRequest, summary: StudySummary,
    plans: dict[int, Plan], *, name: str,
) -> None:
    """One transaction: the fitting clusters' plans (found or inserted), the study's outcome, its points;
    nothing when the study was cancelled, deleted or queued again meanwhile (so never twice)."""
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
    finished = session.execute(update(StudyRow).where(*_ours(study_id, attempt)).values(
        state=StudyState.succeeded, finished_at=utcnow(), candidates_done=len(summary.points),
        num_fitting=sum(p.fits for p in summary.points), best_so_far=None,
        summary=summary.model_dump(mode="json", exclude={"points"}),
    ).returning(StudyRow.id)).first()
    if finished is None:  # cancelled or deleted while it ran: its plans are not stored either
        session.rollback()
        return
    session.add_all(
        StudyPointRow(study_id=study_id, position=position, plan_id=plan_ids.get(position),
                      point=point.model_dump(mode="json"))
        for position, point in enumerate(summary.points)
    )
    session.commit()


def summary_of(row: StudyRow) -> StudySummaryOut:
    return StudySummaryOut(
        id=row.id, name=row.name, model_name=row.model_name, token_budget=row.token_budget,
        deadline_days=row.deadline_days, gpus=row.gpus.split(","), state=StudyState(row.state),
        num_candidates=row.num_candidates, candidates_done=row.candidates_done, num_fitting=row.num_fitting,
        error=row.error, planner_version=row.planner_version, created_at=row.created_at,
        started_at=row.started_at, finished_at=row.finished_at, attempts=row.attempts,
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
    best = None if row.best_so_far is None else StudyPoint.model_validate(row.best_so_far)
    return StudyDetail(**summary_of(row).model_dump(), request=row.request, best_so_far=best, points=points,
                       **picks)


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
    """Delete a study and its points; its plans stay (they are ordinary plans, maybe shared). A running
    study's job stops at its next progress write."""
    deleted = session.execute(delete(StudyRow).where(StudyRow.id == study_id).returning(StudyRow.id)).first()
    if deleted is None:
        raise study_not_found(study_id)
    session.commit()


def study_not_found(study_id: int) -> ProblemError:
    return ProblemError(404, f"there is no study {study_id}; list studies with GET /api/v1/studies",
                        slug="study-not-found", title="Study not found",
                        errors=[FieldError(location="path", field="study_id", message="no such study",
                                           type="not_found")])
