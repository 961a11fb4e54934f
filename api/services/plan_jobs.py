"""Large plan searches and re-plans as jobs: submit (check the inputs, store a queued `plan_jobs` row),
run the job (the search, then the plan stored as an ordinary plan), read it back.

A re-plan, and a POST /plans whose model has more layer-graph units than `Settings.job_threshold_units`,
is answered with 202 and a `Location` (GET /api/v1/plan-jobs/{id}) instead of holding its request while
it searches. The same job engines as studies run it (api/services/jobs.py in the web process,
api/services/task_engine.py on procrastinate workers), each with a search pool of its own: a small
`POST /plans` never queues behind it. Everything a client can get wrong is checked before the job is
queued (422/404 at once); what the search itself refuses (nothing fits, the deadline) fails the job
with the problem the synchronous request would have answered.

The plan is stored by `plans.save` / `replan.replan`, exactly as by a synchronous request: plans are
deduplicated by their input hash, so a job run twice (its worker killed after storing) stores one plan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker, undefer

from api.db.base import utcnow
from api.db.models import PlanJobRow, PlanRow
from api.problems import ProblemError, problem_response
from api.schemas.plan_jobs import PlanJobOut, PlanJobState
from api.schemas.plans import PlanCreate, ReplanCreate
from api.services import job_rows
from api.services import plans as plan_service
from api.services import replan as replan_service
from api.services.job_rows import JobEnd
from api.services.keyed_locks import KeyedLocks
from api.services.search_pool import SearchPool, SearchPoolBrokenError
from planner.catalog.models import resolve_model
from planner.errors import PlanningError
from planner.hashing import plan_hash
from planner.specs import ModelSpec

log = logging.getLogger(__name__)
NO_LIMIT = 1 << 30
"""The job's own size check: the request's was made when it was queued."""


def model_units(model: ModelSpec) -> int:
    """What a request's size is measured in: layer-graph units (traced models), else layers."""
    return len(model.layer_graph) if model.layer_graph else model.num_layers


def units_of(body: PlanCreate) -> int | None:
    """The units of a POST /plans body's model, or None when it names no model that resolves (the
    synchronous path answers that with its 422)."""
    try:
        return model_units(resolve_model(body.model))
    except (PlanningError, ValueError):
        return None


@dataclass(frozen=True)
class Submission:
    job_id: int
    replayed: bool = False
    """True when an Idempotency-Key named a job submitted before (this request stored nothing)."""


def _claim(key: str | None, fingerprint: str, ttl_s: int) -> plan_service.KeyClaim | None:
    return None if key is None else plan_service.KeyClaim(key=key, fingerprint=fingerprint, ttl_s=ttl_s)


def replay(session: Session, key: str, fingerprint: str, ttl_s: int) -> Submission | None:
    """The job submitted with this key (a 422 problem for another request), or None while it is free."""
    claim = plan_service.KeyClaim(key=key, fingerprint=fingerprint, ttl_s=ttl_s)
    job_id = job_rows.keyed_job(session, PlanJobRow, claim)
    return None if job_id is None else Submission(job_id, replayed=True)


def has_keyed_job(session: Session, key: str, fingerprint: str, ttl_s: int) -> bool:
    """Whether this key named a plan job (a 422 problem for another request). The session's connection
    goes back to the pool before the caller waits on the key's lock: fifty requests with one key must
    not hold fifty connections while they take turns."""
    try:
        return replay(session, key, fingerprint, ttl_s) is not None
    finally:
        session.rollback()


def replan_fingerprint(plan_id: int, body: ReplanCreate) -> str:
    """sha256 of a re-plan request: the plan it names and its body."""
    canonical = json.dumps({"plan_id": plan_id, "body": body.model_dump(mode="json")}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def submit_plan(
    session: Session, body: PlanCreate, *, locks: KeyedLocks, max_model_layers: int, search_pool: SearchPool,
    idempotency_key: str | None = None, idempotency_ttl_s: int = 24 * 3600, enqueue: Any = None,
) -> Submission | None:
    """Queue the search of a large plan: its inputs checked now (422s), nothing searched. None when the
    plan is stored already, or the key answered it already (the caller answers synchronously, as before).
    """
    claim = _claim(idempotency_key, plan_service.fingerprint(body), idempotency_ttl_s)
    with locks.hold(f"idempotency-key:{idempotency_key}") if claim is not None else nullcontext():
        if claim is not None:
            replayed = replay(session, claim.key, claim.fingerprint, claim.ttl_s)
            if replayed is not None:
                return replayed
            # The key answered a synchronous plan: the same body is answered as it was, another is a 422.
            if plan_service._replay(session, claim) is not None:
                session.commit()
                return None
        request = plan_service.build_request(body, max_model_layers=max_model_layers, search_pool=search_pool)
        plan_service.calibration_profile(session, body.calibration_id, request)
        calibration_id = None if body.calibration_id is None else str(body.calibration_id)
        if plan_service.find(session, plan_hash(request, calibration_id=calibration_id)) is not None:
            session.commit()
            return None
        cluster = request.cluster
        name = body.name or (f"{request.model.name} on {cluster.num_nodes}x{cluster.gpus_per_node}x"
                             f"{cluster.gpu}")
        return _store(session, claim, enqueue, kind="plan", name=name, units=model_units(request.model),
                      body=body.model_dump(mode="json"), source_plan_id=None)


def submit_replan(
    session: Session, plan_id: int, body: ReplanCreate, *, locks: KeyedLocks,
    idempotency_key: str | None = None, idempotency_ttl_s: int = 24 * 3600, enqueue: Any = None,
) -> Submission:
    """Queue a re-plan: the plan and the run checked now (404, 422), the search in the job."""
    claim = _claim(idempotency_key, replan_fingerprint(plan_id, body), idempotency_ttl_s)
    with locks.hold(f"idempotency-key:{idempotency_key}") if claim is not None else nullcontext():
        if claim is not None:
            replayed = replay(session, claim.key, claim.fingerprint, claim.ttl_s)
            if replayed is not None:
                return replayed
        source = session.scalar(select(PlanRow).where(PlanRow.id == plan_id)
                                .options(undefer(PlanRow.request)))
        if source is None:
            raise plan_service.plan_not_found(plan_id)
        replan_service.failed_run(session, source, body.run_id)
        model = source.request.get("model") or {}
        units = len(model.get("layer_graph") or []) or int(model.get("num_layers") or 0)
        name = body.name or replan_service.replanned_name(source.name)
        submission = _store(session, claim, enqueue, kind="replan", name=name, units=units,
                            body=body.model_dump(mode="json"), source_plan_id=source.id)
        assert submission is not None
        return submission


def _store(
    session: Session, claim: plan_service.KeyClaim | None, enqueue: Any, *, kind: str, name: str, units: int,
    body: dict[str, Any], source_plan_id: int | None,
) -> Submission:
    values = {
        "kind": kind, "name": name[:200], "units": units, "body": body, "source_plan_id": source_plan_id,
    }
    job_id, replayed = job_rows.store_queued(session, PlanJobRow, values, claim, enqueue)
    return Submission(job_id, replayed=replayed)


def _ours(job_id: int, attempt: int) -> tuple[Any, ...]:
    """The job still runs this attempt (not queued again, nor failed by a worker that gave up on it)."""
    return PlanJobRow.id == job_id, PlanJobRow.state == PlanJobState.running, PlanJobRow.attempts == attempt


def run_plan_job(
    session_factory: sessionmaker[Session], job_id: int, *, search_pool: SearchPool,
    stopping: threading.Event, take_over: bool = False,
) -> JobEnd:
    """The job of one plan search: claim it (queued -> running), search and store the plan as the
    synchronous request would have (running -> succeeded, naming it), or record the problem (failed).

    `take_over`: also claim a job left `running` by an earlier attempt whose process died (the task
    engine knows that no other attempt runs); the old attempt's number fences it out."""
    claimable = (PlanJobState.queued, PlanJobState.running) if take_over else (PlanJobState.queued,)
    with session_factory() as session:
        now = utcnow()
        claimed = session.execute(update(PlanJobRow).where(
            PlanJobRow.id == job_id, PlanJobRow.state.in_(claimable)
        ).values(state=PlanJobState.running, started_at=now, heartbeat_at=now,
                 attempts=PlanJobRow.attempts + 1).returning(PlanJobRow.attempts)).first()
        session.commit()
        if claimed is None:
            return JobEnd.not_claimed
        attempt = claimed.attempts
        try:
            row = session.scalar(select(PlanJobRow).where(PlanJobRow.id == job_id)
                                 .options(undefer(PlanJobRow.body)))
            if row is None:
                return JobEnd.finished
            kind, body, source_plan_id = row.kind, row.body, row.source_plan_id
            session.commit()
            locks = KeyedLocks()
            if kind == "replan":
                assert source_plan_id is not None
                outcome = replan_service.replan(session, source_plan_id, ReplanCreate.model_validate(body),
                                                locks=locks, search_pool=search_pool)
            else:
                outcome = plan_service.create_plan(session, PlanCreate.model_validate(body), locks=locks,
                                                   search_pool=search_pool, max_model_layers=NO_LIMIT)
            plan_id = outcome.row.id
            session.commit()
            _set(session, job_id, attempt, state=PlanJobState.succeeded, plan_id=plan_id,
                 status_code=outcome.status_code, finished_at=utcnow())
        except ProblemError as problem:
            session.rollback()
            _fail(session, job_id, attempt, problem.detail, problem)
        except SearchPoolBrokenError:
            session.rollback()
            _fail(session, job_id, attempt, "the process searching this plan stopped before answering (it "
                  "may have run out of memory); send the request again", None)
        except Exception as error:  # a bug: the job says it failed instead of staying 'running'
            log.exception("plan job %s failed", job_id)
            session.rollback()
            _fail(session, job_id, attempt, f"internal error ({type(error).__name__}); the server log has "
                  "the details", None)
        return JobEnd.finished


def _set(session: Session, job_id: int, attempt: int, **values: Any) -> None:
    session.execute(update(PlanJobRow).where(*_ours(job_id, attempt)).values(**values))
    session.commit()


def _fail(session: Session, job_id: int, attempt: int, reason: str, problem: ProblemError | None) -> None:
    document = None
    if problem is not None:
        response = problem_response(problem.status, problem.detail, slug=problem.slug, title=problem.title,
                                    errors=problem.errors, **problem.extensions)
        document = json.loads(response.body)
    _set(session, job_id, attempt, state=PlanJobState.failed, error=reason, problem=document,
         finished_at=utcnow())


def beat(session: Session, job_ids: Any) -> None:
    job_rows.beat(session, PlanJobRow, job_ids)


def get_job(session: Session, job_id: int) -> PlanJobOut:
    row = session.get(PlanJobRow, job_id)
    session.commit()
    if row is None:
        raise job_not_found(job_id)
    return job_out(row)


def job_out(row: PlanJobRow) -> PlanJobOut:
    return PlanJobOut(
        id=row.id, kind=row.kind, state=PlanJobState(row.state), name=row.name, units=row.units,  # type: ignore[arg-type]
        source_plan_id=row.source_plan_id, plan_id=row.plan_id,
        plan_url=None if row.plan_id is None else f"/api/v1/plans/{row.plan_id}",
        status_code=row.status_code, error=row.error, problem=row.problem, attempts=row.attempts,
        created_at=row.created_at, started_at=row.started_at, finished_at=row.finished_at,
    )


def job_not_found(job_id: int) -> ProblemError:
    return ProblemError(404, f"there is no plan job {job_id}; a POST /api/v1/plans beyond the job "
                        "threshold, or a re-plan, answers with its Location", slug="plan-job-not-found",
                        title="Plan job not found")
