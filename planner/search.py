"""Search the parallel configuration space and build the Plan document.

Walks the enumeration (planner/enumeration.py: tensor-parallel degree x sharding x wrap unit x
bucket caps x checkpointing x micro-batch x compile), prunes by memory first (cheap, closed form),
times what fits on the two-stream timeline, ranks by predicted tokens/s and explains why every
other family lost (planner/ranking.py), and assembles the Plan (planner/document.py).
Deterministic: candidates are enumerated in a fixed order and ties broken by their fields.
"""

from __future__ import annotations

from time import process_time

from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.cost.estimate import Estimator, TimeEstimate
from planner.cost.memory import MemoryEstimate, fits_in_memory, memory_limit_gib
from planner.cost.model_costs import model_costs
from planner.cost.parameters import CostParameters, default_parameters
from planner.cost.setting import Setting
from planner.document import choice_from_config, mfu, plan_document
from planner.enumeration import check_mesh, enumerate_choices
from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError
from planner.hashing import plan_hash
from planner.plan import ParallelConfig, Plan, PlanWarning
from planner.ranking import Evaluated, ranked, rejected_families
from planner.specs import PlanRequest


def make_plan(
    request: PlanRequest,
    *,
    calibration: CalibrationProfile | None = None,
    calibration_id: str | None = None,
    time_limit_s: float | None = None,
) -> Plan:
    """The best plan for a request, with ranked alternatives and why other families lost.

    Raises InfeasiblePlanError (naming the smallest cluster that would fit) when nothing fits, and
    SearchDeadlineError when pricing the candidates takes more than `time_limit_s` seconds of CPU
    time (CPU, not wall-clock, so that whether a request fits the limit does not depend on the load).
    """
    _check_request(request)
    deadline = None if time_limit_s is None else process_time() + time_limit_s
    setting = build_setting(request, calibration, calibration_id)
    estimator = Estimator(setting)
    limit = memory_limit_gib(setting.params, request.search.memory_headroom)
    ceiling = request.search.max_peak_memory_gib  # exclusive; set when re-planning after an OOM
    evaluated: list[Evaluated] = []
    min_peak: Evaluated | None = None
    count = 0
    # Bucket caps often resolve to the same grouping (units larger than the cap): price it once.
    priced: dict[tuple, tuple[MemoryEstimate, TimeEstimate | None]] = {}
    for choice in enumerate_choices(request, setting):
        if deadline is not None and process_time() > deadline:
            raise _over_deadline(request, time_limit_s or 0.0, count)
        count += 1
        key = (choice.priced_key, estimator.layout(choice).signature)
        if key not in priced:
            mem = estimator.memory(choice)
            fits = fits_in_memory(mem, limit_gib=limit, ceiling_gib=ceiling)
            priced[key] = (mem, estimator.timing(choice) if fits else None)
        mem, time = priced[key]
        entry = Evaluated.priced(setting, choice, mem, time)
        if time is None and (min_peak is None or mem.total < min_peak.memory.total):
            min_peak = entry
        evaluated.append(entry)

    fitting = ranked([e for e in evaluated if e.time is not None])
    if not fitting:
        raise _infeasible(request, setting, limit, min_peak)
    best = fitting[0]
    best = Evaluated.priced(setting, best.choice, best.memory, estimator.timing(best.choice, record=True))
    return plan_document(
        request,
        setting,
        best,
        fitting=fitting,
        rejected=rejected_families(evaluated, best, limit),
        count=count,
        warnings=_warnings(request, setting, best),
    )


def _over_deadline(request: PlanRequest, time_limit_s: float, priced: int) -> SearchDeadlineError:
    units = f"{len(request.model.layer_graph)} layer-graph units" if request.model.layer_graph else None
    shrink = [
        "restrict search.shardings, search.compile or search.checkpointing",
        "lower search.max_micro_batch_size",
    ]
    if units:
        shrink.insert(0, f"merge the {units} into fewer, larger blocks (identical blocks are priced once)")
    return SearchDeadlineError(
        f"search: stopped after {time_limit_s:g} s of CPU time, the limit per plan, with {priced} "
        f"configurations priced; shrink the search: {'; '.join(shrink)}",
        time_limit_s=time_limit_s,
        candidates_priced=priced,
    )


def _check_request(request: PlanRequest) -> None:
    """Refuse what the runtime would refuse: planner/advice.py (imported here, as in `_infeasible`)."""
    from planner.advice import check_sequence_length

    check_sequence_length(request)


def _warnings(request: PlanRequest, setting: Setting, best: Evaluated) -> tuple[PlanWarning, ...]:
    """What to know about the chosen plan: planner/advice.py (imported here, as in `_infeasible`)."""
    from planner.advice import plan_warnings

    assert best.time is not None
    return plan_warnings(
        request,
        best.time,
        micro_batch=best.choice.micro_batch_size,
        mfu=mfu(setting, best.tokens_per_s_per_gpu),
    )


def predict(
    request: PlanRequest,
    config: ParallelConfig,
    *,
    calibration: CalibrationProfile | None = None,
    calibration_id: str | None = None,
) -> Plan:
    """A Plan for exactly `config` (no search): what-if questions and measuring the cost model.

    Raises PlanningError when the configuration cannot run this request (its mesh does not match
    the cluster or the sharding, its tensor-parallel degree cannot split the model, or its batch
    split does not reach the global batch).
    """
    check_mesh(request, config.sharding, config.mesh)
    local_batch = request.training.global_batch_sequences // config.mesh.dp
    if config.micro_batch_size * config.grad_accum_steps != local_batch:
        raise PlanningError(
            f"config: micro_batch_size {config.micro_batch_size} x grad_accum_steps "
            f"{config.grad_accum_steps} must equal the per-data-parallel-rank batch {local_batch}",
            field="config",
        )
    choice = choice_from_config(config)
    _check_request(request)
    setting = build_setting(request, calibration, calibration_id)
    estimator = Estimator(setting)
    time = estimator.timing(choice, record=True)
    evaluated = Evaluated.priced(setting, choice, estimator.memory(choice), time)
    digest = plan_hash(
        request, calibration_id=setting.params.calibration_id, config=config.model_dump(mode="json")
    )
    return plan_document(
        request,
        setting,
        evaluated,
        fitting=[evaluated],
        rejected=[],
        count=1,
        warnings=_warnings(request, setting, evaluated),
        digest=digest,
    )


# ---------------------------------------------------------------- set-up


def build_setting(
    request: PlanRequest, calibration: CalibrationProfile | None = None, calibration_id: str | None = None
) -> Setting:
    """What the search holds fixed: the priced model and the (calibrated) cost parameters."""
    cluster = request.cluster
    gpu = resolve_gpu(cluster.gpu)
    params: CostParameters = default_parameters(gpu, cluster, request.training.precision)
    if calibration is not None:
        params = fit_parameters(
            calibration,
            base=params,
            precision=request.training.precision,
            optimizer=request.training.optimizer,
        )
        # A calibrated plan must never share its hash with an uncalibrated one: name the profile by
        # its content when the caller gives no id.
        calibration_id = calibration_id or calibration.content_id()
    if calibration_id is not None:
        params = params.with_changes(calibration_id=calibration_id)
    return Setting(
        model=model_costs(request.model, request.training.seq_len),
        params=params,
        precision=request.training.precision,
        optimizer=request.training.optimizer,
        world_size=cluster.world_size,
        gpus_per_node=cluster.gpus_per_node,
        num_nodes=cluster.num_nodes,
        seq_len=request.training.seq_len,
        global_batch_sequences=request.training.global_batch_sequences,
    )



def _infeasible(
    request: PlanRequest, setting: Setting, limit: float, min_peak: Evaluated | None
) -> InfeasiblePlanError:
    """Explain that nothing fits and what would: planner/advice.py (imported here: it searches
    other clusters through the same enumeration and memory test)."""
    from planner.advice import infeasible_error

    assert min_peak is not None
    return infeasible_error(request, setting, limit_gib=limit, peak_gib=min_peak.peak_gib)
