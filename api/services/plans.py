"""Creating plans: validate, dedup by input hash (before searching), search, store; Idempotency-Key replay.

Runs in a worker thread (the endpoints are sync); the CPU-bound search itself runs in the app's search
pool (api/services/search_pool.py), so it holds neither the event loop nor the web process's GIL.
Identical concurrent requests in one process wait on a per-hash lock and find the stored row; across
processes the unique `plan_hash` constraint decides and the loser returns the winner's row.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, undefer

from api.db.base import utcnow
from api.db.models import IdempotencyKeyRow, PlanRow
from api.problems import FieldError, ProblemError, field_errors, summarize
from api.schemas.plans import PlanCreate
from api.services import calibrations as calibration_service
from api.services.keyed_locks import KeyedLocks
from api.services.search_pool import SearchPool, SearchPoolBrokenError
from planner.calibration import CalibrationProfile
from planner.catalog import resolve_model
from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError
from planner.hashing import plan_hash
from planner.plan import Plan
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec


@dataclass(frozen=True)
class PlanOutcome:
    row: PlanRow
    status_code: int
    """201 when this request stored the plan, 200 when it was already stored."""
    replayed: bool = False
    """True when an Idempotency-Key replayed an earlier response."""


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
    fingerprint = _fingerprint(body)
    if idempotency_key is not None:
        replay = _replay(session, idempotency_key, fingerprint, idempotency_ttl_s)
        if replay is not None:
            return replay
    request = build_request(body, max_model_layers=max_model_layers)
    profile: CalibrationProfile | None = None
    if body.calibration_id is not None:
        calibration = calibration_service.find_calibration(session, body.calibration_id)
        if calibration is None:
            raise ProblemError(
                422, f"calibration profile {body.calibration_id} does not exist; upload a profile first "
                "or leave out calibration_id to plan with catalog peaks",
                slug="unknown-calibration", title="Unknown calibration profile",
                errors=[FieldError(location="body", field="calibration_id",
                                   message="no such calibration profile", type="not_found")],
            )
        profile = calibration_service.load_profile(calibration)
        calibration_service.check_matches_cluster(calibration, profile, request.cluster.gpu)
    calibration_id = None if body.calibration_id is None else str(body.calibration_id)
    digest = plan_hash(request, calibration_id=calibration_id)
    # End the read transaction: nothing here should hold a pooled connection while waiting or searching.
    session.commit()
    with locks.hold(digest):
        row = find(session, digest)
        if row is None:
            session.commit()
            plan = search(search_pool, request, profile, calibration_id)
            row, created = store(
                session,
                row_for(request, plan, digest, name=body.name, calibration_id=body.calibration_id),
            )
        else:
            created = False
    outcome = PlanOutcome(row=row, status_code=201 if created else 200)
    if idempotency_key is not None:
        return _remember(session, idempotency_key, fingerprint, outcome, idempotency_ttl_s)
    return outcome


def build_request(body: PlanCreate, *, max_model_layers: int) -> PlanRequest:
    """The planner's PlanRequest for an API body; invalid combinations become 422 problems."""
    try:
        model: ModelSpec = resolve_model(body.model)
        _check_size(model, max_model_layers)
        cluster = (
            ClusterSpec.parse(body.cluster) if isinstance(body.cluster, str)
            else ClusterSpec(**body.cluster.model_dump(exclude_none=True))
        )
        return PlanRequest(
            model=model,
            cluster=cluster,
            training=TrainingSpec(**body.training.model_dump()),
            search=body.search if body.search is not None else PlanRequest.model_fields["search"].default,
            top_k=body.top_k,
        )
    except PlanningError as exc:
        raise unplannable(exc) from None
    except ValidationError as exc:
        errors = _request_errors(exc)
        raise ProblemError(
            422, summarize(errors), slug="invalid-request", title="Invalid request", errors=errors
        ) from None
    except ValueError as exc:  # ClusterSpec.parse's "cannot read '...'" message
        raise ProblemError(
            422, str(exc), slug="invalid-request", title="Invalid request",
            errors=[FieldError(location="body", field="cluster", message=str(exc), type="value_error")],
        ) from None


def _check_size(model: ModelSpec, max_layers: int) -> None:
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


def _request_errors(exc: ValidationError) -> list[FieldError]:
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
            min_fitting_nodes=exc.min_fitting_nodes, min_peak_memory_gib=exc.min_peak_memory_gib,
            capacity_gib=exc.capacity_gib,
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
        raise ProblemError(
            503, "the process searching this plan stopped before answering (it may have run out of "
            "memory); nothing was stored: send the request again", slug="search-failed",
            title="Search failed", headers={"Retry-After": "1"},
        ) from None


def row_for(
    request: PlanRequest, plan: Plan, digest: str, *, name: str | None, calibration_id: int | None
) -> PlanRow:
    """The row that stores `plan` (refused when the cost model produced non-finite numbers)."""
    document = plan.model_dump(mode="json")
    if not _all_finite(document):
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
        plan_hash=digest,
        planner_version=plan.planner_version,
        calibration_id=calibration_id,
        request=request.model_dump(mode="json"),
        plan=document,
    )


def store(session: Session, row: PlanRow) -> tuple[PlanRow, bool]:
    """Insert `row`, or return the row another process stored for the same hash first."""
    session.add(row)
    try:
        session.commit()
        return row, True
    except IntegrityError:
        session.rollback()
        existing = find(session, row.plan_hash)
        if existing is not None:
            return existing, False
        if row.calibration_id is not None:
            raise ProblemError(
                422, f"calibration profile {row.calibration_id} was deleted while planning; plan again",
                slug="unknown-calibration", title="Unknown calibration profile",
            ) from None
        raise


def find(session: Session, digest: str) -> PlanRow | None:
    return session.scalar(select(PlanRow).where(PlanRow.plan_hash == digest).options(*full_plan()))


def full_plan() -> tuple[Any, ...]:
    """Loader options that fetch the deferred documents along with a plan row."""
    return undefer(PlanRow.request), undefer(PlanRow.plan)


def _fingerprint(body: PlanCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(session: Session, key: str, fingerprint: str, ttl_s: int) -> PlanOutcome | None:
    remembered = session.scalar(select(IdempotencyKeyRow).where(IdempotencyKeyRow.key == key))
    if remembered is None:
        return None
    if remembered.created_at < utcnow() - timedelta(seconds=ttl_s):
        session.delete(remembered)
        session.commit()
        return None
    if remembered.request_fingerprint != fingerprint:
        raise ProblemError(
            422, "this Idempotency-Key was already used with a different request body; use a new key "
            "for a new request, or resend the original body to get the original response",
            slug="idempotency-key-reused", title="Idempotency-Key reused",
            errors=[FieldError(location="header", field="Idempotency-Key", message="used with another body",
                               type="idempotency_key_reused")],
        )
    row = session.scalar(select(PlanRow).where(PlanRow.id == remembered.plan_id).options(*full_plan()))
    if row is None:  # the plan was deleted in between; the cascade removes the key with it
        return None
    return PlanOutcome(row=row, status_code=remembered.status_code, replayed=True)


def _remember(session: Session, key: str, fingerprint: str, outcome: PlanOutcome, ttl_s: int) -> PlanOutcome:
    # Expired keys are purged as new ones arrive, so the table stays as small as one TTL of traffic.
    session.execute(
        delete(IdempotencyKeyRow).where(IdempotencyKeyRow.created_at < utcnow() - timedelta(seconds=ttl_s))
    )
    session.add(IdempotencyKeyRow(
        key=key, request_fingerprint=fingerprint, plan_id=outcome.row.id, status_code=outcome.status_code
    ))
    try:
        session.commit()
    except IntegrityError:
        # The same key raced us: whoever stored it first defines the response (or the conflict).
        session.rollback()
        replay = _replay(session, key, fingerprint, ttl_s)
        if replay is None:
            raise
        return replay
    return outcome


def _all_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


def plan_not_found(plan_id: int) -> ProblemError:
    """The 404 for a plan id that names no stored plan (every /plans/{id}/... endpoint answers it)."""
    return ProblemError(
        404, f"plan {plan_id} does not exist (it may have been deleted); list plans with GET /api/v1/plans",
        slug="plan-not-found", title="Plan not found",
    )
