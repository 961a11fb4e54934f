"""Search the parallel configuration space and build the Plan document.

Enumerates sharding x wrap unit x bucket caps x checkpointing x micro-batch x compile, prunes by
memory first (cheap, closed form), times what fits on the two-stream timeline, ranks by predicted
tokens/s, and explains why every other family of configurations lost. Deterministic: candidates are
enumerated in a fixed order and ties broken by their label.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from time import process_time

from planner import PLANNER_VERSION
from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.cost.estimate import Estimator, TimeEstimate
from planner.cost.memory import MemoryEstimate, fits_in_memory, loss_chunks_for, memory_limit_gib
from planner.cost.model_costs import model_costs
from planner.cost.parameters import GIB, CostParameters, default_parameters
from planner.cost.setting import Choice, Setting
from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError
from planner.formatting import duration
from planner.hashing import plan_hash
from planner.plan import (
    Candidate,
    CheckpointingConfig,
    InductorConfig,
    MemoryBreakdown,
    ParallelConfig,
    Plan,
    PlannedCluster,
    PlannedModel,
    PlannedTraining,
    PlanWarning,
    Prediction,
    RejectedFamily,
    SearchStats,
    TimelineSegment,
)
from planner.specs import PlanRequest

BLOCKS_PER_UNIT = (1, 2, 4, 8)
BUCKET_CAPS_MB = (0.0, 64.0, 512.0)
SELECTIVE_EVERY_K = (2, 4)
PARETO_LIMIT = 40


@dataclass(frozen=True, slots=True)
class Evaluated:
    choice: Choice
    memory: MemoryEstimate
    time: TimeEstimate | None
    tokens_per_s_per_gpu: float

    @property
    def peak_gib(self) -> float:
        return self.memory.total / GIB


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
        # Everything of the choice but what the layout signature already stands for.
        key = (
            replace(choice, blocks_per_unit=1, all_gather_bucket_mb=0.0, reduce_scatter_bucket_mb=0.0),
            estimator.layout(choice).signature,
        )
        if key not in priced:
            mem = estimator.memory(choice)
            fits = fits_in_memory(mem, limit_gib=limit, ceiling_gib=ceiling)
            priced[key] = (mem, estimator.timing(choice) if fits else None)
        mem, time = priced[key]
        if time is None:
            entry = Evaluated(choice, mem, None, 0.0)
            if min_peak is None or mem.total < min_peak.memory.total:
                min_peak = entry
            evaluated.append(entry)
            continue
        tps = request.training.seq_len * choice.micro_batch * choice.grad_accum / time.step_time_s
        evaluated.append(Evaluated(choice, mem, time, tps))

    fitting = [e for e in evaluated if e.time is not None]
    if not fitting:
        raise _infeasible(request, setting, limit, min_peak)
    # Ties broken by the choice's fields, so the ranking never depends on enumeration details.
    fitting.sort(key=lambda e: (-round(e.tokens_per_s_per_gpu, 6), round(e.peak_gib, 6), repr(e.choice)))
    best = fitting[0]
    best_time = estimator.timing(best.choice, record=True)
    best = Evaluated(best.choice, best.memory, best_time, best.tokens_per_s_per_gpu)

    return _plan_document(
        request, setting, best, fitting=fitting, evaluated=evaluated, count=count, limit=limit
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


def _plan_document(
    request: PlanRequest,
    setting: Setting,
    best: Evaluated,
    *,
    fitting: list[Evaluated],
    evaluated: list[Evaluated],
    count: int,
    limit: float | None = None,
    digest: str | None = None,
) -> Plan:
    return Plan(
        planner_version=PLANNER_VERSION,
        plan_hash=digest or plan_hash(request, calibration_id=setting.params.calibration_id),
        model=_planned_model(request, setting),
        cluster=PlannedCluster(
            **request.cluster.model_dump(),
            world_size=request.cluster.world_size,
            gpu_spec=resolve_gpu(request.cluster.gpu),
        ),
        training=PlannedTraining(
            **request.training.model_dump(),
            global_batch_sequences=request.training.global_batch_sequences,
        ),
        config=to_parallel_config(best.choice, request),
        prediction=_prediction(setting, best, headroom=request.search.memory_headroom),
        alternatives=tuple(
            _candidate(e, best, setting, request) for e in _distinct(best, fitting[1:], request.top_k)
        ),
        pareto_front=tuple(_candidate(e, best, setting, request) for e in _pareto(fitting)),
        rejected=tuple(_rejected_families(evaluated, best, limit)) if limit is not None else (),
        calibration_id=setting.params.calibration_id,
        search=SearchStats(candidates_evaluated=count, candidates_fitting=len(fitting)),
        warnings=_warnings(request, setting, best),
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
        request, best.time, micro_batch=best.choice.micro_batch, mfu=_mfu(setting, best.tokens_per_s_per_gpu)
    )


def predict(
    request: PlanRequest,
    config: ParallelConfig,
    *,
    calibration: CalibrationProfile | None = None,
    calibration_id: str | None = None,
) -> Plan:
    """A Plan for exactly `config` (no search): what-if questions and measuring the cost model.

    Raises PlanningError when the configuration cannot run this request (its batch split does not
    reach the global batch, or its groups do not divide the cluster).
    """
    world = request.cluster.world_size
    local_batch = request.training.global_batch_sequences // world
    if config.micro_batch_size * config.grad_accum_steps != local_batch:
        raise PlanningError(
            f"config: micro_batch_size {config.micro_batch_size} x grad_accum_steps "
            f"{config.grad_accum_steps} must equal the per-rank batch {local_batch}",
            field="config",
        )
    if config.shard_group_size * config.replicate_group_size != world:
        raise PlanningError(
            f"config: shard_group_size x replicate_group_size must equal the world size {world}",
            field="config",
        )
    choice = Choice(
        sharding=config.sharding,
        shard_group=config.shard_group_size,
        replicate_group=config.replicate_group_size,
        blocks_per_unit=config.blocks_per_unit,
        all_gather_bucket_mb=config.all_gather_bucket_mb,
        reduce_scatter_bucket_mb=config.reduce_scatter_bucket_mb,
        checkpointing=config.checkpointing.mode,
        every_k=config.checkpointing.every_k,
        micro_batch=config.micro_batch_size,
        grad_accum=config.grad_accum_steps,
        compile=config.compile,
        prefetch_depth=config.prefetch_depth,
        loss_chunks=config.loss_chunks,
    )
    _check_request(request)
    setting = build_setting(request, calibration, calibration_id)
    estimator = Estimator(setting)
    time = estimator.timing(choice, record=True)
    tps = request.training.seq_len * choice.micro_batch * choice.grad_accum / time.step_time_s
    evaluated = Evaluated(choice, estimator.memory(choice), time, tps)
    digest = plan_hash(
        request, calibration_id=setting.params.calibration_id, config=config.model_dump(mode="json")
    )
    return _plan_document(
        request, setting, evaluated, fitting=[evaluated], evaluated=[evaluated], count=1, digest=digest
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


def _planned_model(request: PlanRequest, setting: Setting) -> PlannedModel:
    return PlannedModel(
        **request.model.model_dump(),
        num_params=setting.model.num_params,
        num_params_embedding=setting.model.num_params_embedding,
        flops_per_token=setting.model.flops_per_token,
    )


# ---------------------------------------------------------------- enumeration


def hybrid_shard_sizes(world: int, gpus_per_node: int) -> list[int]:
    """Shard-group sizes for a 2-D mesh: divisors of the world strictly between 1 and world that
    line up with nodes (a divisor of the node size, or a whole number of nodes)."""
    return [
        s
        for s in range(2, world)
        if world % s == 0 and (gpus_per_node % s == 0 or s % gpus_per_node == 0) and _is_pow2_multiple(s)
    ]


def _is_pow2_multiple(n: int) -> bool:
    # Keeps the 2-D options to a handful at large scale (2, 4, 8, 16, ... or 3, 6, 12, ...).
    odd = n
    while odd % 2 == 0:
        odd //= 2
    return odd <= 3


def micro_batch_sizes(local_batch: int, limit: int) -> list[int]:
    """Divisors of the per-rank batch up to a limit: powers of two, plus the whole local batch."""
    sizes = {d for d in (2**i for i in range(0, 16)) if d <= limit and local_batch % d == 0}
    if local_batch <= limit:
        sizes.add(local_batch)
    return sorted(sizes)


def enumerate_choices(request: PlanRequest, setting: Setting) -> Iterator[Choice]:
    """Every configuration the request allows that the runtime executes differently, in a fixed
    order. Wrap units matter only to eager FSDP2 on more than one GPU: compiled SimpleFSDP never
    groups parameters by unit (inductor buckets them by the caps), and one GPU has nothing to gather.
    The loss is sliced by one rule (`loss_chunks_for`), not searched."""
    world = request.cluster.world_size
    search = request.search
    shardings: list[tuple[str, int]] = []
    for sharding in search.shardings:
        if world == 1 and sharding != "no_shard":
            continue  # a single GPU has nothing to shard over
        if sharding == "hybrid_shard":
            shardings += [(sharding, s) for s in hybrid_shard_sizes(world, request.cluster.gpus_per_node)]
        elif sharding == "no_shard":
            shardings.append((sharding, 1))
        else:
            shardings.append((sharding, world))
    layers = (
        request.model.num_layers
        if request.model.architecture != "layer_graph"
        else max(1, sum(1 for u in request.model.layer_graph or [] if u.is_block))
    )
    units = [k for k in BLOCKS_PER_UNIT if k <= layers]
    checkpointing: list[tuple[str, int]] = []
    for mode in search.checkpointing:
        if mode == "selective":
            checkpointing += [(mode, k) for k in SELECTIVE_EVERY_K if k <= layers]
        else:
            checkpointing.append((mode, 1))
    local_batch = request.training.global_batch_sequences // world
    micro_batches = micro_batch_sizes(local_batch, search.max_micro_batch_size)
    chunks = {
        mb: loss_chunks_for(mb * setting.seq_len, setting.model.vocab_size, setting.act_bytes)
        for mb in micro_batches
    }
    for sharding, shard in shardings:
        replicas = world // shard
        for compile_ in search.compile:
            caps = [(a, r) for a in BUCKET_CAPS_MB for r in BUCKET_CAPS_MB] if compile_ else [(0.0, 0.0)]
            if sharding == "no_shard" or world == 1:
                caps = [(0.0, 0.0)]  # nothing is all-gathered; DDP-style buckets are fixed
            for unit in units if world > 1 and not compile_ else [1]:
                for ag_cap, rs_cap in caps:
                    for mode, every_k in checkpointing:
                        for mb in micro_batches:
                            yield Choice(
                                sharding=sharding,
                                shard_group=shard,
                                replicate_group=replicas,
                                blocks_per_unit=unit,
                                all_gather_bucket_mb=ag_cap,
                                reduce_scatter_bucket_mb=rs_cap,
                                checkpointing=mode,
                                every_k=every_k,
                                micro_batch=mb,
                                grad_accum=local_batch // mb,
                                compile=compile_,
                                loss_chunks=chunks[mb],
                            )


# ---------------------------------------------------------------- results


def to_parallel_config(choice: Choice, request: PlanRequest) -> ParallelConfig:
    bf16 = request.training.precision == "bf16"
    return ParallelConfig(
        sharding=choice.sharding,  # type: ignore[arg-type]
        shard_group_size=choice.shard_group,
        replicate_group_size=choice.replicate_group,
        blocks_per_unit=choice.blocks_per_unit,
        all_gather_bucket_mb=choice.all_gather_bucket_mb,
        reduce_scatter_bucket_mb=choice.reduce_scatter_bucket_mb,
        reshard_after_forward=choice.reshards_after_forward,
        prefetch_depth=choice.prefetch_depth,
        checkpointing=CheckpointingConfig(mode=choice.checkpointing, every_k=choice.every_k),  # type: ignore[arg-type]
        micro_batch_size=choice.micro_batch,
        grad_accum_steps=choice.grad_accum,
        param_dtype="bfloat16" if bf16 else "float32",
        reduce_dtype="float32",
        compile=choice.compile,
        loss_chunks=choice.loss_chunks,
        inductor=InductorConfig(
            bucket_all_gathers=choice.compile and choice.all_gather_bucket_mb > 0,
            bucket_reduce_scatters=choice.compile and choice.reduce_scatter_bucket_mb > 0,
            reorder_for_compute_comm_overlap=choice.compile and choice.sharding != "no_shard",
        ),
    )


def _mfu(setting: Setting, tokens_per_s_per_gpu: float) -> float:
    return tokens_per_s_per_gpu * setting.model.flops_per_token / setting.params.mfu_peak_flops


def _prediction(setting: Setting, e: Evaluated, *, headroom: float) -> Prediction:
    assert e.time is not None
    t = e.time
    m = e.memory
    params = setting.params
    segments = tuple(
        TimelineSegment(
            stream=stream,
            phase=phase,
            label=label,  # type: ignore[arg-type]
            start_s=round(start, 9),
            end_s=round(end, 9),
            exposed_s=round(exposed, 9),
        )
        for stream, phase, label, start, end, exposed in t.micro_batch_timeline.segments
    )
    return Prediction(
        step_time_s=t.step_time_s,
        tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
        tokens_per_s=e.tokens_per_s_per_gpu * setting.world_size,
        mfu=_mfu(setting, e.tokens_per_s_per_gpu),
        peak_memory_gib=m.total / GIB,
        memory_breakdown_gib=MemoryBreakdown(
            **{name: value / GIB for name, value in m.terms().items()},
            moment=m.moment,  # type: ignore[arg-type]
        ),
        usable_memory_gib=params.usable_memory_gib * (1.0 - headroom),
        memory_margin=params.memory_margin,
        memory_margin_reason=params.memory_margin_reason,
        compute_s=t.compute_s,
        comm_s=t.comm_s,
        exposed_comm_s=t.exposed_comm_s,
        exposed_all_gather_s=t.exposed_all_gather_s,
        exposed_reduce_scatter_s=t.exposed_reduce_s,
        optimizer_s=t.optimizer_s,
        overhead_s=t.overhead_s,
        timeline=segments,
    )


def _candidate(e: Evaluated, best: Evaluated, setting: Setting, request: PlanRequest) -> Candidate:
    assert e.time is not None
    return Candidate(
        label=(config := to_parallel_config(e.choice, request)).label(),
        config=config,
        step_time_s=e.time.step_time_s,
        tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
        mfu=_mfu(setting, e.tokens_per_s_per_gpu),
        peak_memory_gib=e.peak_gib,
        exposed_comm_s=e.time.exposed_comm_s,
        relative_throughput=e.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu,
    )


def _distinct(best: Evaluated, ranked: list[Evaluated], k: int) -> list[Evaluated]:
    """The next k configurations that differ in more than bucket caps that change nothing."""

    def key(e: Evaluated) -> tuple:
        c = e.choice
        return (
            c.sharding,
            c.shard_group,
            c.blocks_per_unit,
            c.checkpointing,
            c.every_k,
            c.micro_batch,
            c.compile,
            round(e.tokens_per_s_per_gpu, 3),
        )

    seen: set[tuple] = {key(best)}
    out: list[Evaluated] = []
    for e in ranked:
        if key(e) in seen:
            continue
        seen.add(key(e))
        out.append(e)
        if len(out) == k:
            break
    return out


def _pareto(ranked: list[Evaluated]) -> list[Evaluated]:
    """Configurations no other beats on both throughput and peak memory (ranked: fastest first)."""
    front: list[Evaluated] = []
    lowest = math.inf
    for e in ranked:
        if e.peak_gib < lowest - 1e-9:
            front.append(e)
            lowest = e.peak_gib
    if len(front) > PARETO_LIMIT:
        step = (len(front) - 1) / (PARETO_LIMIT - 1)
        front = [front[round(i * step)] for i in range(PARETO_LIMIT)]
    return front


def _rejected_families(evaluated: list[Evaluated], best: Evaluated, limit: float) -> list[RejectedFamily]:
    """For each family (sharding x compile) other than the winner's: why it lost."""
    families: dict[str, list[Evaluated]] = {}
    for e in evaluated:
        families.setdefault(e.choice.family, []).append(e)
    out: list[RejectedFamily] = []
    for family, members in families.items():
        if family == best.choice.family:
            continue
        fitting = [e for e in members if e.time is not None]
        smallest = min(e.peak_gib for e in members)
        if not fitting:
            out.append(
                RejectedFamily(
                    family=family,
                    kind="oom",
                    reason=f"OOM by {smallest - limit:.1f} GiB: needs at least {smallest:.1f} GiB per GPU, "
                    f"at most {limit:.1f} GiB fits with the memory margin",
                    min_peak_memory_gib=smallest,
                )
            )
            continue
        top = max(fitting, key=lambda e: (e.tokens_per_s_per_gpu, -e.peak_gib))
        out.append(
            RejectedFamily(
                family=family,
                kind="slower",
                reason=_slower_reason(top, best),
                best_tokens_per_s_per_gpu=top.tokens_per_s_per_gpu,
                min_peak_memory_gib=smallest,
            )
        )
    out.sort(key=lambda r: (r.kind != "slower", -(r.best_tokens_per_s_per_gpu or 0.0), r.family))
    return out


def _slower_reason(loser: Evaluated, best: Evaluated) -> str:
    assert loser.time is not None and best.time is not None
    slower_fraction = 1.0 - loser.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu
    slower = f"{slower_fraction:.0%}" if slower_fraction >= 0.01 else f"{slower_fraction:.1%}"

    # Compare per token so that different micro-batching stays comparable.
    def per_token(e: Evaluated, seconds: float) -> float:
        return seconds / (e.choice.micro_batch * e.choice.grad_accum)

    lt, bt = loser.time, best.time
    reduce_name = "all-reduce" if loser.choice.sharding == "no_shard" else "reduce-scatter"
    deltas = {
        "exposed all-gather": (
            per_token(loser, lt.exposed_all_gather_s) - per_token(best, bt.exposed_all_gather_s)
        ),
        f"exposed {reduce_name}": (
            per_token(loser, lt.exposed_reduce_s) - per_token(best, bt.exposed_reduce_s)
        ),
        "compute": per_token(loser, lt.compute_s) - per_token(best, bt.compute_s),
    }
    cause, _ = max(deltas.items(), key=lambda kv: kv[1])
    if cause == "compute":
        c = loser.choice
        why = []
        if c.checkpointing != "none":
            why.append(f"recomputation ({c.checkpointing.replace('_', ' ')} checkpointing)")
        if not c.compile and best.choice.compile:
            why.append("unfused eager kernels")
        detail = " and ".join(why) or "smaller, less efficient kernels"
        return f"{slower} slower: {detail}, compute {duration(lt.compute_s)}/step"
    exposed = lt.exposed_all_gather_s if cause == "exposed all-gather" else lt.exposed_reduce_s
    return f"{slower} slower: {cause} {duration(exposed)}/step"


def _infeasible(
    request: PlanRequest, setting: Setting, limit: float, min_peak: Evaluated | None
) -> InfeasiblePlanError:
    """Explain that nothing fits and what would: planner/advice.py (imported here: it searches
    other clusters through this module's enumeration)."""
    from planner.advice import infeasible_error

    assert min_peak is not None
    return infeasible_error(request, setting, limit_gib=limit, peak_gib=min_peak.peak_gib)
