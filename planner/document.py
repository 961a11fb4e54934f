"""Assemble the Plan document from the search's priced configurations.

One converter each way between the search's light `Choice` and the Plan's `ParallelConfig`
(their shared fields have the same names), and the prediction, candidates and the whole document.
"""

from __future__ import annotations

from dataclasses import fields

from contract.parallel_config import CheckpointingConfig, InductorConfig, ParallelConfig
from planner import PLANNER_VERSION
from planner.cost.estimate import Estimator
from planner.cost.expert_memory import expert_parts
from planner.cost.memory import memory_margin_for
from planner.cost.parameters import GIB
from planner.cost.setting import Choice, Setting
from planner.hashing import plan_hash
from planner.plan import (
    Candidate,
    ExpertMemory,
    MemoryBreakdown,
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
from planner.plan_intervals import PlanIntervals, lead_within_interval
from planner.ranking import Evaluated, distinct, pareto
from planner.specs import PlanRequest

_SHARED_FIELDS = tuple(
    f.name
    for f in fields(Choice)
    if f.name in {c.name for c in fields(ParallelConfig)} and f.name != "checkpointing"
)
"""Fields that the Choice and the ParallelConfig both carry, under the same name."""


def to_parallel_config(choice: Choice, request: PlanRequest) -> ParallelConfig:
    """The Plan's configuration for a choice: its own fields, plus what they imply."""
    bf16 = request.training.precision == "bf16"
    return ParallelConfig(
        **{name: getattr(choice, name) for name in _SHARED_FIELDS},
        checkpointing=checkpointing_config(choice),
        reshard_after_forward=choice.reshards_after_forward,
        param_dtype="bfloat16" if bf16 else "float32",
        inductor=InductorConfig(
            bucket_all_gathers=choice.compile and choice.all_gather_bucket_mb > 0,
            bucket_reduce_scatters=choice.compile and choice.reduce_scatter_bucket_mb > 0,
            reorder_for_compute_comm_overlap=choice.compile and choice.sharding != "no_shard",
        ),
    )


def choice_from_config(config: ParallelConfig) -> Choice:
    """The search's choice for a Plan's configuration (what `predict` prices)."""
    ac = config.checkpointing
    return Choice(
        **{name: getattr(config, name) for name in _SHARED_FIELDS},
        checkpointing=ac.mode,
        every_k=ac.blocks if ac.mode == "blocks" else ac.every_k,
    )


def checkpointing_config(choice: Choice) -> CheckpointingConfig:
    """The Plan's checkpointing for a choice: its policy's number (`Choice.every_k`) is `blocks` for
    mode `blocks`, `every_k` otherwise."""
    if choice.checkpointing == "blocks":
        return CheckpointingConfig(mode="blocks", blocks=choice.every_k)
    return CheckpointingConfig(mode=choice.checkpointing, every_k=choice.every_k)  # type: ignore[arg-type]


def mfu(setting: Setting, tokens_per_s_per_gpu: float) -> float:
    return tokens_per_s_per_gpu * setting.model.flops_per_token / setting.params.mfu_peak_flops


def plan_document(
    request: PlanRequest,
    setting: Setting,
    best: Evaluated,
    *,
    fitting: list[Evaluated],
    rejected: list[RejectedFamily],
    count: int,
    fitting_count: int,
    warnings: tuple[PlanWarning, ...],
    digest: str | None = None,
    intervals: bool = True,
    estimator: Estimator | None = None,
) -> Plan:
    """The Plan for `best`, with the `fitting` alternatives (timed, ranked best first) beside it;
    `count` configurations were enumerated, `fitting_count` of them fit. The pick and the
    configurations shown beside it carry their 80% intervals (planner/plan_intervals.py), and the
    warnings grow by what those say; without `intervals` (a corpus run priced for the fit, whose
    report places its own) they are left out. `estimator`: the search's, whose caches the intervals'
    prices share."""
    bands = PlanIntervals(request, setting, estimator) if intervals else None
    prediction = _prediction(setting, best, headroom=request.search.memory_headroom, intervals=bands)
    alternatives = tuple(
        _candidate(e, best, setting, request, bands) for e in distinct(best, fitting[1:], request.top_k)
    )
    lead = lead_within_interval(prediction, alternatives, tuple(rejected))
    return Plan(
        planner_version=PLANNER_VERSION,
        plan_hash=digest or plan_hash(request, calibration_id=setting.params.calibration_id),
        model=PlannedModel(
            **request.model.model_dump(),
            num_params=setting.model.num_params,
            num_params_embedding=setting.model.num_params_embedding,
            active_params=setting.model.active_params,
            flops_per_token=setting.model.flops_per_token,
        ),
        cluster=PlannedCluster(
            # A domain that spans nodes is written out, so that the runtime checks groups against it.
            **request.cluster.model_dump()
            | ({} if request.cluster.scaleup_gpus <= request.cluster.gpus_per_node
               else {"scaleup_domain_gpus": request.cluster.scaleup_gpus}),
            world_size=request.cluster.world_size,
            gpu_spec=request.cluster.resolved_gpu(),
        ),
        training=PlannedTraining(
            **request.training.model_dump(),
            global_batch_sequences=request.training.global_batch_sequences,
        ),
        config=to_parallel_config(best.choice, request),
        prediction=prediction,
        alternatives=alternatives,
        pareto_front=tuple(_candidate(e, best, setting, request, bands) for e in pareto(fitting)),
        rejected=tuple(rejected),
        calibration_id=setting.params.calibration_id,
        search=SearchStats(candidates_evaluated=count, candidates_fitting=fitting_count),
        warnings=(*warnings, *(bands.warnings(best) if bands else ()), *([lead] if lead else [])),
        network_assumed=bands.network_assumed if bands else None,
    )


def _prediction(
    setting: Setting, e: Evaluated, *, headroom: float, intervals: PlanIntervals | None
) -> Prediction:
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
    margin, margin_reason = memory_margin_for(params, e.choice.mesh)
    return Prediction(
        step_time_s=t.step_time_s,
        tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
        tokens_per_s=e.tokens_per_s_per_gpu * setting.world_size,
        mfu=mfu(setting, e.tokens_per_s_per_gpu),
        peak_memory_gib=m.total / GIB,
        **(intervals.of(e) if intervals else {}),
        memory_breakdown_gib=MemoryBreakdown(
            **{name: value / GIB for name, value in m.terms().items()},
            moment=m.moment,  # type: ignore[arg-type]
        ),
        expert_memory_gib=_expert_memory(setting, e),
        usable_memory_gib=params.usable_memory_gib * (1.0 - headroom),
        memory_margin=margin,
        memory_margin_reason=margin_reason,
        compute_s=t.compute_s,
        comm_s=t.comm_s,
        exposed_comm_s=t.exposed_comm_s,
        exposed_all_gather_s=t.exposed_all_gather_s,
        exposed_reduce_scatter_s=t.exposed_reduce_s,
        exposed_tensor_parallel_s=t.tensor_parallel_s,
        exposed_expert_parallel_s=t.expert_parallel_s,
        pipeline_bubble_s=t.pipeline_bubble_s,
        exposed_pipeline_p2p_s=t.pipeline_p2p_s,
        optimizer_s=t.optimizer_s,
        overhead_s=t.overhead_s,
        timeline=segments,
    )


def _expert_memory(setting: Setting, e: Evaluated) -> ExpertMemory | None:
    """The peak's routed experts', dispatch buffers' and dense parts (None for a dense model)."""
    parts = expert_parts(setting, e.choice, e.memory)
    if parts is None:
        return None
    experts = parts.states + parts.gathered + parts.activations + parts.dispatch
    return ExpertMemory(
        routed_expert_states=parts.states / GIB,
        routed_expert_gathered=parts.gathered / GIB,
        routed_expert_activations=parts.activations / GIB,
        dispatch_buffers=parts.dispatch / GIB,
        dense_parts=(e.memory.total - experts) / GIB,
    )


def _candidate(
    e: Evaluated, best: Evaluated, setting: Setting, request: PlanRequest, intervals: PlanIntervals | None
) -> Candidate:
    assert e.time is not None
    return Candidate(
        label=(config := to_parallel_config(e.choice, request)).label(),
        config=config,
        step_time_s=e.time.step_time_s,
        tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
        mfu=mfu(setting, e.tokens_per_s_per_gpu),
        peak_memory_gib=e.peak_gib,
        exposed_comm_s=e.time.exposed_comm_s,
        relative_throughput=e.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu,
        **(intervals.of(e) if intervals else {}),
    )
