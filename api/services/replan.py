"""Re-planning after an out-of-memory run: the same request, without every configuration predicted to
need at least as much memory as the one that failed.

The failed configuration is re-priced with the current planner (`planner.search.predict`, under the
stored plan's calibration), so the ceiling and the new search come from the same cost model even when
the stored plan was made by an older planner. The ceiling goes into the request
(`search.max_peak_memory_gib`, exclusive), so it is part of the new plan's hash: re-planning the same
failure twice returns the same stored plan.

The new search runs in the app's search pool under its deadline, as POST /plans does: the web process
only re-prices the one failed configuration.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.db.models import PlanRow, ValidationRunRow
from api.problems import FieldError, ProblemError
from api.schemas.plans import ReplanCreate
from api.services import calibrations as calibration_service
from api.services import plans as plan_service
from api.services.keyed_locks import KeyedLocks
from api.services.search_pool import SearchPool, SearchPoolBrokenError
from planner.calibration import CalibrationProfile
from planner.cost.memory import memory_limit_gib
from planner.errors import InfeasiblePlanError, PlanningError
from planner.hashing import plan_hash
from planner.plan import Plan, RejectedFamily
from planner.search import predict
from planner.search_setting import build_setting
from planner.specs import PlanRequest


def replan(
    session: Session, plan_id: int, body: ReplanCreate, *, locks: KeyedLocks, search_pool: SearchPool
) -> plan_service.PlanOutcome:
    """Store (or find) the plan for `plan_id`'s request below its failed configuration's peak."""
    return plan_service.counted("replan", lambda: _replan(
        session, plan_id, body, locks=locks, search_pool=search_pool,
    ))


def _replan(
    session: Session, plan_id: int, body: ReplanCreate, *, locks: KeyedLocks, search_pool: SearchPool
) -> plan_service.PlanOutcome:
    source = session.scalar(
        select(PlanRow).where(PlanRow.id == plan_id).options(*plan_service.full_plan())
    )
    if source is None:
        raise plan_service.plan_not_found(plan_id)
    run = failed_run(session, source, body.run_id)
    request = PlanRequest.model_validate(source.request)
    config = Plan.model_validate(source.plan).config  # through the upgrader: rows of every schema
    profile: CalibrationProfile | None = None
    calibration_id = None if source.calibration_id is None else str(source.calibration_id)
    if source.calibration_id is not None:
        stored = calibration_service.get_calibration(session, source.calibration_id)
        profile = calibration_service.load_profile(stored)
    try:
        failed = predict(request, config, calibration=profile, calibration_id=calibration_id)
    except PlanningError as exc:
        raise plan_service.unplannable(exc) from None
    ceiling = failed.prediction.peak_memory_gib
    if request.search.max_peak_memory_gib is not None:  # a re-plan of a re-plan keeps the lower ceiling
        ceiling = min(ceiling, request.search.max_peak_memory_gib)
    # Through validation (not model_copy), so the request is exactly one a client could have sent.
    document = request.model_dump(mode="json")
    document["search"]["max_peak_memory_gib"] = ceiling
    request = PlanRequest.model_validate(document)
    digest = plan_hash(request, calibration_id=calibration_id)
    session.commit()  # hold no connection while searching
    with locks.hold(digest):
        row = plan_service.find(session, digest)
        if row is not None:
            return plan_service.PlanOutcome(row=row, status_code=200)
        session.commit()
        plan = _search(
            search_pool, request, profile, calibration_id, source=source, failed=failed, run=run,
            ceiling=ceiling,
        )
        row = plan_service.row_for(
            request, plan, digest, name=body.name or replanned_name(source.name),
            calibration_id=source.calibration_id,
        )
        row.replanned_from_plan_id = source.id
        row.replanned_from_run_id = run.id if run is not None else None
        return plan_service.save(session, row)


def replanned_name(name: str) -> str:
    suffix = " (re-planned)"
    return name[: 200 - len(suffix)] + suffix


def failed_run(session: Session, source: PlanRow, run_id: int | None) -> ValidationRunRow | None:
    """The OOM run named by `run_id`, else the plan's newest OOM run, else None (the plan's own config)."""
    if run_id is None:
        return session.scalar(
            select(ValidationRunRow)
            .where(ValidationRunRow.plan_id == source.id, ValidationRunRow.outcome == "oom")
            .order_by(ValidationRunRow.id.desc())
            .limit(1)
        )
    run = session.get(ValidationRunRow, run_id)
    if run is None or run.plan_id != source.id:
        raise ProblemError(
            422, f"run {run_id} is not a validation run of plan {source.id}; list its runs with "
            f"GET /api/v1/plans/{source.id}/runs, or leave out run_id to use its newest OOM run",
            slug="unknown-run", title="Unknown validation run",
            errors=[FieldError(location="body", field="run_id", message="no such run of this plan",
                               type="not_found")],
        )
    if run.outcome != "oom":
        raise ProblemError(
            422, f"run {run_id} completed (it did not run out of memory): re-planning excludes "
            "configurations as memory-hungry as one that failed. Leave out run_id to re-plan around "
            "the plan's own configuration anyway",
            slug="run-not-oom", title="Run did not run out of memory",
            errors=[FieldError(location="body", field="run_id", message="not an out-of-memory run",
                               type="not_oom")],
        )
    return run


def _search(
    pool: SearchPool,
    request: PlanRequest,
    profile: CalibrationProfile | None,
    calibration_id: str | None,
    *,
    source: PlanRow,
    failed: Plan,
    run: ValidationRunRow | None,
    ceiling: float,
) -> Plan:
    what = f"plan {source.id}'s configuration ({failed.config.label()})"
    if run is not None:
        what += f", which ran out of memory in run {run.id}"
    try:
        plan = pool.search(request, profile, calibration_id)
    except InfeasiblePlanError as exc:
        # The planner's advice already honours the ceiling: a cluster it names plans under it.
        raise _nothing_lighter(request, what, ceiling, exc) from None
    except PlanningError as exc:  # the search deadline among them
        raise plan_service.unplannable(exc) from None
    except SearchPoolBrokenError:
        raise plan_service.search_failed() from None
    # What the planner allows without the ceiling: the families above it OOM for real.
    params = build_setting(request, profile, calibration_id).params
    usable = memory_limit_gib(params, request.search.memory_headroom)
    rejected = tuple(_mark_excluded(r, usable, ceiling, what) for r in plan.rejected)
    return plan.model_copy(update={"rejected": rejected})


def _nothing_lighter(
    request: PlanRequest, what: str, ceiling: float, refusal: InfeasiblePlanError
) -> ProblemError:
    cluster = request.cluster
    return ProblemError(
        422, f"nothing lighter is left: every configuration of {request.model.name} on "
        f"{cluster.num_nodes}x{cluster.gpus_per_node}x{cluster.gpu} is predicted to need "
        f"{_gib(ceiling)} GiB per GPU or more, as much as {what}. {refusal.advice}",
        slug="infeasible-plan", title="No configuration fits in memory",
        errors=[FieldError(location="body", field="cluster", message="no lighter configuration",
                           type="infeasible")],
        **{**refusal.problem_fields(), "max_peak_memory_gib": ceiling},
    )


def _mark_excluded(family: RejectedFamily, usable: float, ceiling: float, what: str) -> RejectedFamily:
    """A family "OOM" only because of the ceiling (it fits the GPU) says so instead."""
    lightest = family.min_peak_memory_gib
    if family.memory_limit_gib is not None:  # the family's mesh may keep a wider margin
        usable = family.memory_limit_gib
    if family.kind != "oom" or lightest is None or lightest > usable:
        return family
    return family.model_copy(update={
        "kind": "excluded",
        "reason": f"excluded by the re-plan: needs at least {_gib(lightest)} GiB per GPU, at or above the "
        f"{_gib(ceiling)} GiB of {what}",
    })



def _gib(value: float) -> str:
    # Debug models on CPU peak below 1 GiB: two decimals would make different peaks look equal.
    return f"{value:.2f}" if value >= 10 else f"{value:.3g}"
