"""Creating plans: validate, dedup by input hash (before searching), search, store; Idempotency-Key replay.

Runs in a worker thread (the endpoints are sync); the CPU-bound search itself runs in the app's search
pool (api/services/search_pool.py), so it holds neither the event loop nor the web process's GIL.
Nothing is written until the search is done; then one transaction (`save`) stores the plan and claims
the Idempotency-Key, or stores nothing. The unique constraints on the plan hash and on the key decide
races, between threads and between server processes alike; per-hash and per-key locks only spare a
process searching twice for one answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, undefer

from api.db.base import utcnow
from api.db.inserts import insert_unless_taken, is_foreign_key_violation
from api.db.models import IdempotencyKeyRow, PlanRow
from api.metrics import series as plan_metrics
from api.problems import FieldError, ProblemError, field_errors, summarize
from api.schemas.plans import PlanCreate
from api.services import calibrations as calibration_service
from api.services.keyed_locks import KeyedLocks
from api.services.search_pool import SearchPool, SearchPoolBrokenError
from planner.bounds import all_finite
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError, SearchSpaceError
from planner.hashing import plan_hash
from planner.plan import Plan
from planner.precheck import PartialSequencesError, read_request
from planner.specs import ClusterSpec, ModelSpec, PlanRequest

# `save` retries only when a plan is deleted in the instant between two of its statements.
SAVE_ATTEMPTS = 3


@dataclass(frozen=True)
class PlanOutcome:
    row: PlanRow
    status_code: int
    """201 when this request stored the plan, 200 when it was already stored."""
    replayed: bool = False
    """True when an Idempotency-Key replayed an earlier response."""


@dataclass(frozen=True)
class KeyClaim:
    """An `Idempotency-Key` and the body it came with, to be stored together with the plan it answers."""

    key: str
    fingerprint: str
    """sha256 of the canonical request body: the same key with another body is refused."""
    ttl_s: int

    def cutoff(self) -> datetime:
        """Keys stored before this are forgotten."""
        return utcnow() - timedelta(seconds=self.ttl_s)


def create_plan(
    session: Session,
    body: PlanCreate,
    *,
    locks: KeyedLocks,
    search_pool: SearchPool,
    max_model_layers: int,
    idempotency_key: str | None = None,
    idempotency_ttl_s: int = 24 * 3600,
) -> PlanOutcome:
    """Find or search and store the plan for `body`; with a key, claim it in the same transaction.

    Three steps, and only the last one writes: read (an earlier answer to the key, the calibration, a
    stored plan with the same hash), search (CPU-bound, holding no connection), then `save`, one
    transaction that stores the plan and the key or nothing at all. A refused request never gets there.
    """
    return counted("plan", lambda: _create_plan(
        session, body, locks=locks, search_pool=search_pool, max_model_layers=max_model_layers,
        idempotency_key=idempotency_key, idempotency_ttl_s=idempotency_ttl_s,
    ))


def counted(kind: str, create: Callable[[], PlanOutcome]) -> PlanOutcome:
    """`create()`, its outcome counted in the metrics (api/metrics/series.py PLANS: new, cached,
    replayed, refused, failed) as a request of `kind` (`plan`, `replan`)."""
    try:
        outcome = create()
    except ProblemError as exc:
        plan_metrics.count_plan(kind=kind, status=exc.status)
        raise
    except Exception:
        plan_metrics.count_plan(kind=kind, status=500)
        raise
    plan_metrics.count_plan(kind=kind, status=outcome.status_code, replayed=outcome.replayed)
    return outcome


def _create_plan(
    session: Session,
    body: PlanCreate,
    *,
    locks: KeyedLocks,
    search_pool: SearchPool,
    max_model_layers: int,
    idempotency_key: str | None,
    idempotency_ttl_s: int,
) -> PlanOutcome:
    claim = None if idempotency_key is None else KeyClaim(
        key=idempotency_key, fingerprint=fingerprint(body), ttl_s=idempotency_ttl_s
    )
    # In this process, requests with one key take turns, so that a retry finds the first answer instead
    # of searching again for nothing. Between processes the key's unique constraint decides (`save`).
    with locks.hold(f"idempotency-key:{idempotency_key}") if claim is not None else nullcontext():
        if claim is not None:
            replay = _replay(session, claim)
            if replay is not None:
                return replay
        request = build_request(body, max_model_layers=max_model_layers, search_pool=search_pool)
        profile = calibration_profile(session, body.calibration_id, request)
        calibration_id = None if body.calibration_id is None else str(body.calibration_id)
        digest = plan_hash(request, calibration_id=calibration_id)
        # Identical requests in this process wait for one search instead of running one each.
        with locks.hold(digest):
            stored = find(session, digest)
            # End the read transaction: nothing should hold a pooled connection while searching.
            session.commit()
            if stored is not None and claim is None:
                return PlanOutcome(row=stored, status_code=200)
            if stored is None:
                plan = search(search_pool, request, profile, calibration_id)
                stored = row_for(request, plan, digest, name=body.name, calibration_id=body.calibration_id)
            return save(session, stored, claim=claim)


def calibration_profile(
    session: Session, calibration_id: int | None, request: PlanRequest
) -> CalibrationProfile | None:
    """The stored profile a request names (None for none), checked against the cluster's GPU."""
    if calibration_id is None:
        return None
    calibration = calibration_service.find_calibration(session, calibration_id)
    if calibration is None:
        raise _unknown_calibration(
            f"calibration profile {calibration_id} does not exist; upload a profile first "
            "or leave out calibration_id to plan with catalog peaks"
        )
    profile = calibration_service.load_profile(calibration)
    calibration_service.check_matches_cluster(calibration, profile, request.cluster.gpu)
    return profile


def _unknown_calibration(detail: str) -> ProblemError:
    return ProblemError(
        422, detail, slug="unknown-calibration", title="Unknown calibration profile",
        errors=[FieldError(location="body", field="calibration_id", message="no such calibration profile",
                           type="not_found")],
    )


def build_request(body: PlanCreate, *, max_model_layers: int, search_pool: SearchPool) -> PlanRequest:
    """The planner's PlanRequest for an API body; invalid combinations become 422 problems.

    Validation only: a batch of partial sequences is refused with advice looked for in `search_pool`
    (it probes configurations, seconds for a large model), under the pool's deadline per plan.
    """
    try:
        model: ModelSpec = resolve_model(body.model)
        check_model_size(model, max_model_layers)
        cluster = (
            ClusterSpec.parse(body.cluster) if isinstance(body.cluster, str)
            else ClusterSpec(**body.cluster.model_dump(exclude_none=True))
        )
        return read_request({
            "model": model,
            "cluster": cluster,
            # As sent: a batch of partial sequences is refused with batches that plan on this cluster.
            "training": body.training.model_dump(),
            "search": body.search if body.search is not None else PlanRequest.model_fields["search"].default,
            "top_k": body.top_k,
        }, advise=False)
    except PartialSequencesError as exc:
        raise unplannable(advised(search_pool, exc)) from None
    except PlanningError as exc:
        raise unplannable(exc) from None
    except ValidationError as exc:
        errors = request_errors(exc)
        raise ProblemError(
            422, summarize(errors), slug="invalid-request", title="Invalid request", errors=errors
        ) from None


def advised(pool: SearchPool, partial: PartialSequencesError) -> PlanningError:
    """The refusal of a batch of partial sequences, with the advice a pool worker found for it."""
    try:
        return pool.batch_refusal(partial.nearby, partial.tokens)
    except SearchPoolBrokenError:
        raise search_failed() from None


def check_model_size(model: ModelSpec, max_layers: int) -> None:
    # Search time grows with the number of units; one request must not hold a worker for minutes.
    units = len(model.layer_graph) if model.layer_graph else model.num_layers
    if units > max_layers:
        what = "layer-graph units" if model.layer_graph else "layers"
        raise ProblemError(
            422, f"model: {units} {what} is more than this server plans (at most {max_layers}); merge "
            "modules into larger units, or raise FSDP_PLANNER_MAX_MODEL_LAYERS on your own server",
            slug="model-too-large", title="Model too large to plan",
            errors=[FieldError(location="body", field="model", message=f"more than {max_layers} {what}",
                               type="too_large")],
        )


def request_errors(exc: ValidationError) -> list[FieldError]:
    """Field errors of a planner spec, with fields spelled as in the API body."""
    prefix = {"ClusterSpec": "cluster", "TrainingSpec": "training"}.get(exc.title, "")
    fixed = []
    for error in field_errors([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]):
        fixed.append(error.model_copy(update={"field": ".".join(p for p in (prefix, error.field) if p)}))
    return fixed


def unplannable(exc: PlanningError) -> ProblemError:
    field = exc.field or ""
    # The catalog relays pydantic messages of model specs; their "Value error, " prefix is noise here.
    message = exc.message.replace("Value error, ", "")
    errors = [FieldError(location="body", field=field, message=message, type="planning_error")]
    if isinstance(exc, SearchDeadlineError):
        return ProblemError(
            422, message, slug="search-deadline-exceeded", title="Search took too long", errors=errors,
            time_limit_s=exc.time_limit_s, candidates_priced=exc.candidates_priced,
        )
    if isinstance(exc, InfeasiblePlanError):
        return ProblemError(
            422, message, slug="infeasible-plan", title="No configuration fits in memory", errors=errors,
            **exc.problem_fields(),
        )
    if isinstance(exc, SearchSpaceError):
        return ProblemError(
            422, message, slug="search-space-too-large", title="Search space too large", errors=errors,
            configurations_counted=exc.configurations, limit=exc.limit,
        )
    return ProblemError(422, message, slug="unplannable-request", title="Cannot plan this request",
                        errors=errors)


def search(
    pool: SearchPool, request: PlanRequest, profile: CalibrationProfile | None, calibration_id: str | None
) -> Plan:
    """The plan, searched in the pool's worker processes (the request's thread only waits)."""
    try:
        return pool.search(request, profile, calibration_id)
    except PlanningError as exc:
        raise unplannable(exc) from None
    except SearchPoolBrokenError:
        raise search_failed() from None


def search_failed() -> ProblemError:
    """The 503 for a search whose worker process died (SearchPoolBrokenError)."""
    return ProblemError(
        503, "the process searching this plan stopped before answering (it may have run out of "
        "memory); nothing was stored: send the request again", slug="search-failed",
        title="Search failed", headers={"Retry-After": "1"},
    )


def row_for(
    request: PlanRequest, plan: Plan, digest: str, *, name: str | None, calibration_id: int | None
) -> PlanRow:
    """The row that stores `plan` (refused when the cost model produced non-finite numbers)."""
    document = plan.model_dump(mode="json")
    if not all_finite(document):
        raise ProblemError(
            422, "the cost model produced non-finite numbers for these inputs; check for extreme sizes "
            "(sequence length, batch, bandwidth overrides)", slug="unplannable-request",
            title="Cannot plan this request",
        )
    cluster = plan.cluster
    prediction = plan.prediction
    return PlanRow(
        name=name or f"{plan.model.name} on {cluster.num_nodes}x{cluster.gpus_per_node}x{cluster.gpu}",
        model_name=plan.model.name,
        gpu=cluster.gpu,
        num_nodes=cluster.num_nodes,
        gpus_per_node=cluster.gpus_per_node,
        world_size=cluster.world_size,
        tokens_per_s_per_gpu=prediction.tokens_per_s_per_gpu,
        mfu=prediction.mfu,
        peak_memory_gib=prediction.peak_memory_gib,
        step_time_s=prediction.step_time_s,
        sharding=plan.config.sharding,
        mesh=plan.config.mesh.as_document(),
        plan_hash=digest,
        planner_version=plan.planner_version,
        calibration_id=calibration_id,
        request=request.model_dump(mode="json"),
        plan=document,
    )


def save(session: Session, row: PlanRow, *, claim: KeyClaim | None = None) -> PlanOutcome:
    """Store `row` unless a plan with its hash is stored, and claim `claim`'s key for that plan: in one
    transaction, so that a refused request (the key taken by another body) leaves nothing behind.

    `row` is new (from a search) or one found stored before (then only the key is written, and the
    plan is stored again if it was deleted meanwhile). The unique constraints on `plans.plan_hash` and
    `idempotency_keys.key` decide races between threads and between server processes alike.
    """
    values = {
        column.key: getattr(row, column.key)
        for column in PlanRow.__table__.columns
        if column.key not in ("id", "created_at")
    }
    for _ in range(SAVE_ATTEMPTS):
        try:
            outcome = _save_once(session, values, claim, stored_before=row.id is not None)
        except IntegrityError as error:
            session.rollback()
            if not is_foreign_key_violation(error):
                raise
            # The plan's calibration, or the plan the key names, was deleted meanwhile.
            if row.calibration_id is not None and calibration_service.find_calibration(
                session, row.calibration_id
            ) is None:
                raise _unknown_calibration(
                    f"calibration profile {row.calibration_id} was deleted while planning; upload it again "
                    "or leave out calibration_id"
                ) from None
            continue
        if outcome is not None:
            return outcome
    session.rollback()
    raise ProblemError(
        409, "the stored plan changed while this request was saved (deleted or re-created at the same "
        "moment); send the request again", slug="concurrent-change", title="Concurrent change",
    )


def _save_once(
    session: Session, values: dict[str, Any], claim: KeyClaim | None, *, stored_before: bool
) -> PlanOutcome | None:
    """One attempt of `save`: the outcome, or None when a concurrent delete calls for another attempt."""
    digest = values["plan_hash"]
    if claim is not None:
        # First statement, and a write: SQLite takes its write lock here, so the whole transaction is
        # serialized there. An expired key (this one included) is free for a new body.
        session.execute(delete(IdempotencyKeyRow).where(IdempotencyKeyRow.created_at < claim.cutoff()))
    find_id = select(PlanRow.id).where(PlanRow.plan_hash == digest)
    # A plan found before is looked up, not sent again: its documents are large.
    plan_id = session.scalar(find_id) if stored_before else None
    created = False
    if plan_id is None:
        plan_id = insert_unless_taken(session, PlanRow, values, unique="plan_hash")
        created = plan_id is not None
    if plan_id is None:  # stored by a concurrent request that has committed
        plan_id = session.scalar(find_id)
        if plan_id is None:  # ... and deleted since
            session.rollback()
            return None
    status_code = 201 if created else 200
    if claim is not None:
        claimed = insert_unless_taken(session, IdempotencyKeyRow, {
            "key": claim.key, "request_fingerprint": claim.fingerprint, "plan_id": plan_id,
            "status_code": status_code,
        }, unique="key")
        if claimed is None:
            # Another request holds the key: store nothing, answer as it did (or refuse another body).
            session.rollback()
            return _replay(session, claim)
    row = session.scalar(select(PlanRow).where(PlanRow.id == plan_id).options(*full_plan()))
    session.commit()
    return PlanOutcome(row=row, status_code=status_code)


def find(session: Session, digest: str) -> PlanRow | None:
    return session.scalar(select(PlanRow).where(PlanRow.plan_hash == digest).options(*full_plan()))


def full_plan() -> tuple[Any, ...]:
    """Loader options that fetch the deferred documents along with a plan row."""
    return undefer(PlanRow.request), undefer(PlanRow.plan)


def fingerprint(body: BaseModel) -> str:
    """sha256 of a request body's canonical JSON (what an Idempotency-Key is remembered with)."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(session: Session, claim: KeyClaim) -> PlanOutcome | None:
    """The response stored for `claim`'s key (a 422 problem for another body), or None while the key is
    free. Reads only."""
    remembered = session.scalar(
        select(IdempotencyKeyRow).where(
            IdempotencyKeyRow.key == claim.key, IdempotencyKeyRow.created_at >= claim.cutoff()
        )
    )
    if remembered is None:
        return None
    if remembered.request_fingerprint != claim.fingerprint:
        raise key_reused()
    row = session.scalar(select(PlanRow).where(PlanRow.id == remembered.plan_id).options(*full_plan()))
    if row is None:  # the plan was deleted in between; the cascade removes the key with it
        return None
    return PlanOutcome(row=row, status_code=remembered.status_code, replayed=True)


def key_reused() -> ProblemError:
    """The 422 for an Idempotency-Key sent again with another body (plans and studies alike)."""
    return ProblemError(
        422, "this Idempotency-Key was already used with a different request body; use a new key "
        "for a new request, or resend the original body to get the original response",
        slug="idempotency-key-reused", title="Idempotency-Key reused",
        errors=[FieldError(location="header", field="Idempotency-Key", message="used with another body",
                           type="idempotency_key_reused")],
    )


def plan_not_found(plan_id: int) -> ProblemError:
    """The 404 for a plan id that names no stored plan (every /plans/{id}/... endpoint answers it)."""
    return ProblemError(
        404, f"plan {plan_id} does not exist (it may have been deleted); list plans with GET /api/v1/plans",
        slug="plan-not-found", title="Plan not found",
    )
