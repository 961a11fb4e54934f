"""Search the parallel configuration space and build the Plan document.

Walks the enumeration (planner/enumeration.py: tensor-parallel degree x sharding x wrap unit x
bucket caps x checkpointing x micro-batch x compile), prunes by memory first (cheap, closed form),
times what fits on the two-stream timeline, ranks by predicted tokens/s and explains why every
other family lost (planner/ranking.py), and assembles the Plan (planner/document.py).
Deterministic: candidates are enumerated in a fixed order and ties broken by their fields.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from contract.parallel_config import ParallelConfig
from planner.calibration import CalibrationProfile
from planner.collector import collector_paused
from planner.cost.estimate import Estimator
from planner.cost.memory import MemoryEstimate, MemoryLimits, fits_in_memory
from planner.cost.parameters import CostParameters
from planner.cost.setting import Choice, Setting
from planner.deadline import CpuDeadline
from planner.document import choice_from_config, mfu, plan_document
from planner.enumeration import (
    BUCKET_CAPS_MB,
    Family,
    check_async_tp,
    check_float8,
    check_mesh,
    check_pipeline,
    enumerate_families,
    policy_keeps,
    schedule_variants,
)
from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError
from planner.hashing import plan_hash
from planner.infeasibility import infeasible_error
from planner.plan import Plan, PlanWarning
from planner.plan_warnings import plan_warnings
from planner.precheck import check_request, check_sequence_length
from planner.ranking import Evaluated, ranked, rejected_families
from planner.search_setting import build_setting
from planner.specs import PlanRequest


@collector_paused()  # planner/collector.py: a search allocates much and frees it by reference counting
def make_plan(
    request: PlanRequest,
    *,
    calibration: CalibrationProfile | None = None,
    calibration_id: str | None = None,
    time_limit_s: float | None = None,
    advise_other_clusters: bool = True,
) -> Plan:
    """The best plan for a request, with ranked alternatives and why other families lost.

    Raises InfeasiblePlanError (naming the smallest cluster that would fit, unless
    `advise_other_clusters` is False: then only why nothing fits here) when nothing fits, and
    SearchDeadlineError when pricing the candidates takes more than `time_limit_s` seconds of CPU
    time (CPU, not wall-clock, so that whether a request fits the limit does not depend on the load).
    """
    deadline = None if time_limit_s is None else CpuDeadline.after(time_limit_s)
    setting = build_setting(request, calibration, calibration_id)
    check_request(request, setting, deadline=deadline)  # a batch refusal's advice within the deadline
    estimator = Estimator(setting)
    limits = MemoryLimits(setting.params, request.search.memory_headroom)
    ceiling = request.search.max_peak_memory_gib  # exclusive; set when re-planning after an OOM
    evaluated: list[Evaluated] = []
    min_peak: Evaluated | None = None
    count = 0
    board = _Leaderboard(size=(request.top_k + 1) * len(BUCKET_CAPS_MB) ** 2)
    # Bucket caps often resolve to the same grouping (units larger than the cap): price it once.
    memo: dict[tuple, Evaluated] = {}
    # Families are enumerated whole, then timed in order of their floors (see _beaten).
    for family in enumerate_families(request, setting):
        limit = limits(family.mesh)
        choices = _within_reach(family, estimator, limit, ceiling)
        family_start = len(evaluated)
        fitting: list[tuple[Choice, MemoryEstimate, tuple]] = []  # with its memo key
        repeats: list[tuple[Choice, tuple]] = []
        outgrown: set[tuple] = set()
        for choice in choices:
            if deadline is not None and deadline.passed():
                raise _over_deadline(request, deadline.limit_s, count)
            count += 1
            # Memory grows with the micro-batch (activations, the loss's slice); only a single
            # micro-batch per step sheds the accumulated gradients. The enumeration runs the
            # micro-batches in increasing order, so a larger one of a configuration that did not
            # fit does not either.
            growth = choice.growth_key
            if growth in outgrown and choice.grad_accum_steps > 1:
                continue
            key = (choice.priced_key, estimator.layout_signature(choice))
            if key in memo:
                repeats.append((choice, key))
                continue
            mem = estimator.memory(choice)
            if fits_in_memory(mem, limit_gib=limit, ceiling_gib=ceiling):
                memo[key] = Evaluated.untimed(choice, mem, fits=True)  # timed below
                fitting.append((choice, mem, key))
                continue
            memo[key] = entry = Evaluated.untimed(choice, mem, fits=False)
            outgrown.add(growth)
            if min_peak is None or limits.overshoot_gib(mem, choice.mesh) < limits.overshoot_gib(
                min_peak.memory, min_peak.choice.mesh
            ):
                min_peak = entry
            evaluated.append(entry)
        # Most promising first (lowest floor on the step time), so that what is beaten is seen to be.
        floors = sorted(
            ((estimator.floor_s(c), i, c, m, k) for i, (c, m, k) in enumerate(fitting)), key=lambda t: t[:2]
        )
        family_best = 0.0
        for floor_s, _, choice, mem, key in floors:
            if deadline is not None and deadline.passed():
                raise _over_deadline(request, deadline.limit_s, count)
            ceiling_tps = Evaluated.throughput(setting, choice, floor_s)
            if ceiling_tps < min(board.threshold, family_best) and board.dominated(ceiling_tps, mem.total):
                entry = Evaluated.untimed(choice, mem, fits=True)
            else:
                entry = Evaluated.priced(setting, choice, mem, estimator.timing(choice))
                family_best = max(family_best, entry.tokens_per_s_per_gpu)
                board.add(entry.tokens_per_s_per_gpu, entry.memory.total)
            memo[key] = entry
            evaluated.append(entry)
        # Choices that price exactly as one already priced (bucket caps that change nothing).
        evaluated += [replace(memo[key], choice=choice) for choice, key in repeats]
        if family.mesh.pp > 1:
            timed = [e for e in evaluated[family_start:] if e.time is not None]
            evaluated += _other_schedules(request, setting, estimator, timed, limit, ceiling)

    fitting = ranked([e for e in evaluated if e.time is not None])
    if not evaluated:
        raise PlanningError(
            "search: the request's pins leave no configuration to price (search.shardings, compile, "
            "checkpointing, the parallel degrees and pipeline schedules together); widen one of them",
            field="search",
        )
    if not fitting:
        raise _infeasible(
            request, setting, limits, min_peak, advise_other_clusters=advise_other_clusters, deadline=deadline
        )
    best = fitting[0]
    best = Evaluated.priced(setting, best.choice, best.memory, estimator.timing(best.choice, record=True))
    return plan_document(
        request,
        setting,
        best,
        fitting=fitting,
        rejected=rejected_families(evaluated, best, limits, estimator),
        count=count,
        fitting_count=sum(e.fits for e in evaluated),
        warnings=_warnings(request, setting, best),
        estimator=estimator,
    )


class _Leaderboard:
    """What the timed configurations so far prove about an untimed one, from a ceiling on its
    throughput (its step-time floor, `Estimator.floor_s`).

    The search leaves a fitting configuration untimed only when the report cannot show it
    (planner/ranking.py reads timed entries only): its ceiling lies below the best `size`
    throughputs (so it is no alternative: a distinct one repeats at most once per bucket-cap pair,
    hence the size), below its own family's best (so it is not that family's, nor its tp
    degree's, best: a family has one mesh), and a faster configuration needs no more memory (so it
    is off the Pareto front).
    """

    def __init__(self, *, size: int) -> None:
        self.size = size
        self._best: list[float] = []
        self._front: list[tuple[float, float]] = []
        """(tokens/s/GPU, bytes) of the timed configurations no other timed one dominates."""

    def add(self, tokens_per_s_per_gpu: float, memory_bytes: float) -> None:
        if len(self._best) < self.size:
            heapq.heappush(self._best, tokens_per_s_per_gpu)
        else:
            heapq.heappushpop(self._best, tokens_per_s_per_gpu)
        if not self.dominated(tokens_per_s_per_gpu - 1e-12, memory_bytes):
            self._front = [
                (t, m) for t, m in self._front if not (t <= tokens_per_s_per_gpu and m >= memory_bytes)
            ]
            self._front.append((tokens_per_s_per_gpu, memory_bytes))

    @property
    def threshold(self) -> float:
        return self._best[0] if len(self._best) == self.size else 0.0

    def dominated(self, ceiling_tps: float, memory_bytes: float) -> bool:
        """Whether a timed configuration is faster than `ceiling_tps` in no more memory."""
        return any(t > ceiling_tps and m <= memory_bytes for t, m in self._front)


def _within_reach(
    family: Family, estimator: Estimator, limit_gib: float, ceiling_gib: float | None
) -> list[Choice]:
    """The family's choices worth pricing one by one: all of them, unless none can fit: the
    parameters and optimizer states alone (which no checkpointing, micro-batch or bucket changes)
    outgrow the memory limit, or its lightest choices do not fit (`Family.lightest`: the policies
    that keep the least first, so that a family that can fit is seen to after one or two). Then only
    those with its smallest micro-batch and the checkpointing that keeps the least are priced, so
    that what the family needs at least is still reported (planner/ranking.py) while the hopeless
    rest is not (nor built)."""
    layers = len(estimator.setting.model.blocks)
    if estimator.states_gib(family.first()) <= limit_gib and any(
        estimator.fits(c, limit_gib=limit_gib, ceiling_gib=ceiling_gib)
        for c in family.lightest(layers)
    ):
        return family.choices()
    least_kept = min(family.checkpointing, key=lambda policy: policy_keeps(policy, layers))
    return family.choices(checkpointing=[least_kept], micro_batches=[min(family.pipelines)])


def _other_schedules(
    request: PlanRequest,
    setting: Setting,
    estimator: Estimator,
    timed: list[Evaluated],
    limit_gib: float,
    ceiling_gib: float | None,
) -> list[Evaluated]:
    """A pipeline family's fastest configuration (of its `timed` ones) again with every other
    allowed schedule: the family is searched with the preferred schedule (planner/enumeration.py
    SCHEDULE_PREFERENCE), whose choice rarely depends on the rest of the configuration, and the
    others are priced where they could matter."""
    if not timed:
        return []
    best = max(timed, key=lambda e: (e.tokens_per_s_per_gpu, -e.peak_gib))
    variants = []
    for choice in schedule_variants(request, setting, best.choice):
        mem = estimator.memory(choice)
        if fits_in_memory(mem, limit_gib=limit_gib, ceiling_gib=ceiling_gib):
            variants.append(Evaluated.priced(setting, choice, mem, estimator.timing(choice)))
        else:
            variants.append(Evaluated.untimed(choice, mem, fits=False))
    return variants


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


def _warnings(request: PlanRequest, setting: Setting, best: Evaluated) -> tuple[PlanWarning, ...]:
    """What to know about the chosen plan (planner/plan_warnings.py)."""
    assert best.time is not None
    return plan_warnings(
        request,
        best.time,
        micro_batch=best.choice.micro_batch_size,
        mfu=mfu(setting, best.tokens_per_s_per_gpu),
        mesh=best.choice.mesh,
        evidence=setting.params.dimension_throughput,
        float8=best.choice.float8,
        model_costs=setting.model,
    )


@collector_paused()
def predict(
    request: PlanRequest,
    config: ParallelConfig,
    *,
    calibration: CalibrationProfile | None = None,
    calibration_id: str | None = None,
    parameters: CostParameters | None = None,
    intervals: bool = True,
) -> Plan:
    """A Plan for exactly `config` (no search): what-if questions and measuring the cost model.

    `parameters` replaces the cost parameters the request (and calibration) imply: what a correction
    fitted to measured runs would change (planner/fidelity). Without `intervals` the plan carries no
    80% intervals (nor the warnings they imply): the corpus fit prices thousands of runs whose
    report works out intervals of its own (planner/fidelity/report.py), 6% of its time otherwise.

    Raises PlanningError when the configuration cannot run this request (its mesh does not match
    the cluster or the sharding, its tensor-parallel degree cannot split the model, or its batch
    split does not reach the global batch).
    """
    check_mesh(request, config.sharding, config.mesh)
    check_pipeline(request, config)
    check_float8(request, config.float8, field="config.float8")
    if config.async_tp:
        check_async_tp(request, field="config.async_tp")
        if not (config.compile and config.mesh.tp > 1):
            raise PlanningError(
                "config.async_tp: async TP overlaps the collectives of tensor parallelism inside a "
                "compiled graph: it needs compile and mesh.tp > 1", field="config.async_tp",
            )
    sequences, dp = request.training.global_batch_sequences, config.mesh.dp
    if sequences % dp:
        raise PlanningError(
            f"config.mesh: the global batch of {sequences} sequences does not split over its {dp} "
            "data-parallel ranks (dp_replicate x dp_shard); pick a mesh whose data-parallel degree "
            "divides it",
            field="config",
        )
    local_batch = sequences // dp
    if config.micro_batch_size * config.grad_accum_steps != local_batch:
        raise PlanningError(
            f"config: micro_batch_size {config.micro_batch_size} x grad_accum_steps "
            f"{config.grad_accum_steps} must equal the per-data-parallel-rank batch {local_batch}",
            field="config",
        )
    choice = choice_from_config(config)
    check_sequence_length(request)  # the configuration's own batch split is checked above
    setting = build_setting(request, calibration, calibration_id)
    if parameters is not None:
        setting = replace(setting, params=parameters)
    estimator = Estimator(setting)
    time = estimator.timing(choice, record=True)
    evaluated = Evaluated.priced(setting, choice, estimator.memory(choice), time)
    digest = plan_hash(
        request, calibration_id=setting.params.calibration_id, config=config.hashed_document()
    )
    return plan_document(
        request,
        setting,
        evaluated,
        fitting=[evaluated],
        rejected=[],
        count=1,
        fitting_count=1,
        warnings=_warnings(request, setting, evaluated),
        digest=digest,
        intervals=intervals,
        estimator=estimator,
    )


def _infeasible(
    request: PlanRequest,
    setting: Setting,
    limits: MemoryLimits,
    min_peak: Evaluated | None,
    *,
    advise_other_clusters: bool,
    deadline: CpuDeadline | None,
) -> InfeasiblePlanError:
    """Explain that nothing fits and what would (planner/infeasibility.py: it searches other clusters
    through the same enumeration and memory test, within what is left of the search's deadline)."""
    assert min_peak is not None
    return infeasible_error(
        request, setting, limit_gib=limits(min_peak.choice.mesh), peak_gib=min_peak.peak_gib,
        advise_other_clusters=advise_other_clusters, deadline=deadline,
    )
