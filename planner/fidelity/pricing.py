"""Price a corpus run as it was run: its model, cluster (GPUs as deployed), exact configuration and engine.

A run becomes a `PlanRequest` and a `ParallelConfig` that `planner.search.predict` prices without
searching. What the source's trainer did decides the engine priced (`fsdp-planner` for this project's
own runs, `torchtitan` for FSDP trainers that wrap and optionally compile per block: torchtitan,
and FSDP1 trainers such as fms-fsdp and llm-foundry, which wrap and all-gather per block the same
way), the loss (`autograd_fp32` unless the run sliced it), the checkpointing policy, the attention
kernel's generation (`ATTENTION_KERNEL_SPEED`) and, for a mixture of experts, how its tokens reached
their experts (`ExpertRouting`: the dispatch kernels and the gate, as cost parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.parallel_config import CheckpointingConfig, InductorConfig, ParallelConfig, PipelineConfig
from planner.calibration import CalibrationProfile
from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import resolve_model
from planner.cost.parameters import CostParameters
from planner.enumeration import balanced_pipeline, stage_costs
from planner.errors import PlanningError
from planner.fidelity.schema import AttentionKernel, ExpertRouting, Run
from planner.plan import Plan
from planner.search import predict
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec

PROJECT_ENGINES = {"project-simplefsdp", "project-fsdp2"}
"""The corpus names of this project's own trainer (compiled SimpleFSDP, eager FSDP2)."""
FLOAT8_RECIPES = {"float8_tensorwise": "tensorwise", "float8_rowwise": "rowwise", "mxfp8": "mxfp8"}
"""The planner's Float8 recipe for a corpus run's precision (torchao's recipes; bf16 and fp32: none)."""
ATTENTION_KERNEL_SPEED: dict[AttentionKernel, float] = {"flash2": 1.0, "flash1": 0.5, "aiter": 3.05}
"""A kernel generation's attention throughput relative to FlashAttention-2's, which the catalog's
`attention_efficiency` describes (on AMD Instinct GPUs: torch's own flash op, AOTriton's kernels by
default). FlashAttention-2 (Dao, 2023) reports about twice the speed of FlashAttention and of its
Triton port on A100: 50-73% of peak where the first generation reaches 25-40%. AMD's "Deep Dive into
Primus" (ROCm blogs, 2026-01-15) measures AITER's kernels against torch's op in a Llama 3.1 70B step:
47% less forward and 75% less backward latency (Figure 1), so over that step's 7.48% forward and
19.47% backward attention time (Table 2) 26.95 / (7.48 x 0.53 + 19.47 x 0.25) = 3.05x."""
_CHECKPOINTING = {
    "none": "none", "full": "full", "selective_layer": "selective", "selective_op": "op_selective",
    "first_blocks": "blocks",
}


@dataclass(frozen=True, slots=True)
class PricedRun:
    """A run's prediction next to what was measured."""

    run: Run
    plan: Plan
    margin: float
    """The memory margin the planner states for this plan (a fraction of the predicted peak)."""

    @property
    def predicted_tokens_per_s_per_gpu(self) -> float:
        return self.plan.prediction.tokens_per_s_per_gpu

    @property
    def predicted_memory_gib(self) -> float | None:
        """The prediction in the run's own memory counter (None when it cannot be compared)."""
        measured = self.run.measured
        prediction = self.plan.prediction
        if measured.memory_counter == "allocated":
            # What the allocator handed out: the peak less what it keeps reserved but unused.
            return prediction.peak_memory_gib - prediction.memory_breakdown_gib.allocator_reserve
        if measured.memory_counter == "nvidia-smi":
            usable = prediction.usable_memory_gib or 0.0
            return prediction.peak_memory_gib + (self.plan.cluster.gpu_spec.memory_gib - usable)
        return prediction.peak_memory_gib

    @property
    def measured_memory_gib(self) -> float | None:
        measured = self.run.measured
        if measured.peak_memory_gib is not None:
            return measured.peak_memory_gib
        if measured.memory_percent_of_device is not None:
            return measured.memory_percent_of_device / 100.0 * self.plan.cluster.gpu_spec.memory_gib
        return None

    @property
    def throughput_error(self) -> float | None:
        """(predicted - measured) / measured tokens/s per GPU; from MFU when only that is published;
        None when the run's cards ran under a power cap of unstated value (their clock is unknown)."""
        measured = self.run.measured
        if not self.run.throughput_comparable:
            return None
        if measured.tokens_per_s_per_gpu is not None:
            return self.predicted_tokens_per_s_per_gpu / measured.tokens_per_s_per_gpu - 1.0
        if measured.mfu_percent is not None:
            return self.plan.prediction.mfu * 100.0 / measured.mfu_percent - 1.0
        return None

    @property
    def memory_error(self) -> float | None:
        predicted, measured = self.predicted_memory_gib, self.measured_memory_gib
        stated = self.run.measured
        if predicted is None or measured is None or stated.memory_counter == "unknown":
            return None
        if stated.memory_not_comparable:  # an option no planner setting expresses moves the peak
            return None
        return predicted / measured - 1.0

    @property
    def exceeds_margin(self) -> bool:
        """Whether the measured peak is above the predicted one plus the margin the plan states."""
        error = self.memory_error
        return error is not None and (1.0 + error) * (1.0 + self.margin) < 1.0


def run_model(run: Run) -> ModelSpec:
    model = run.config.model
    if isinstance(model, str):
        spec = resolve_model(model)
    else:
        spec = ModelSpec(**model.model_dump(exclude_none=True))
    if spec.max_seq_len < run.config.seq_len:
        spec = spec.model_copy(update={"max_seq_len": run.config.seq_len})
    return spec


def run_cluster(run: Run) -> ClusterSpec:
    """The cluster as deployed: the catalog GPU with the run's memory size and power limit."""
    hardware = run.hardware
    gpu = resolve_gpu(hardware.gpu)
    memory_gib = None
    if hardware.memory_gb is not None and abs(hardware.memory_gb - gpu.nominal_memory) > 0.5:
        memory_gib = hardware.memory_gb * gpu.memory_gib / gpu.nominal_memory
    world = run.config.mesh.world_size
    per_node = hardware.gpus_per_node or min(world, gpu.default_gpus_per_node)
    network = hardware.network_gbps_per_node
    return ClusterSpec(
        num_nodes=hardware.nodes or max(1, world // per_node),
        gpus_per_node=per_node,
        gpu=gpu.name,
        gpu_memory_gib=memory_gib,
        gpu_power_limit_w=hardware.power_limit_w,
        inter_node_bandwidth_gbps=network / 8 / per_node if network else None,
    )


def run_request(run: Run) -> PlanRequest:
    config = run.config
    sequences = config.local_batch_size * config.grad_accum_steps * config.mesh.dp
    return PlanRequest(
        model=run_model(run),
        cluster=run_cluster(run),
        training=TrainingSpec(
            seq_len=config.seq_len,
            global_batch_tokens=sequences * config.seq_len,
            precision="fp32" if config.precision == "fp32" else "bf16",
            state_dtype="bfloat16" if config.master_dtype == "bf16" else "float32",
        ),
    )


def run_engine(run: Run) -> str:
    return "fsdp-planner" if run.config.engine in PROJECT_ENGINES else "torchtitan"


def run_pipeline(
    run: Run, request: PlanRequest, parameters: CostParameters | None = None
) -> PipelineConfig | None:
    """The run's pipeline: its trainer's stage split where the source or recipe states it, else the
    planner's time-balanced split (most sources publish the schedule and micro-batching, not where the
    blocks went), balanced at the cost parameters the run is priced at (`parameters`, else the
    request's)."""
    pipeline = run.config.pipeline
    if run.config.mesh.pp == 1:
        return None
    if pipeline is None:
        raise NotPriceable(f"{run.id}: config.pipeline: the run has pp {run.config.mesh.pp} but no schedule")
    stages = run.config.mesh.pp * pipeline.stages_per_rank
    if pipeline.stage_blocks is not None:
        # The trainer's own split, as its source or recipe states it.
        if len(pipeline.stage_blocks) != stages or sum(pipeline.stage_blocks) != request.model.num_layers:
            raise NotPriceable(
                f"{run.id}: config.pipeline.stage_blocks: {list(pipeline.stage_blocks)} is not {stages} "
                f"stages holding the model's {request.model.num_layers} blocks"
            )
        return PipelineConfig(
            schedule=pipeline.schedule, stages_per_rank=pipeline.stages_per_rank,
            stage_blocks=pipeline.stage_blocks,
        )
    if stages > request.model.num_layers:
        # Megatron counts the embedding and the loss as pipeline layers; the planner's stages hold blocks.
        raise NotPriceable(
            f"{run.id}: config.pipeline: {stages} stages (pp {run.config.mesh.pp} x "
            f"{pipeline.stages_per_rank} per rank) for {request.model.num_layers} blocks"
        )
    setting = build_setting(request, None, None)
    if parameters is not None:
        setting = replace(setting, params=parameters)
    return balanced_pipeline(
        request.model.num_layers,
        stage_costs(setting),
        schedule=pipeline.schedule,
        stages_per_rank=pipeline.stages_per_rank,
        pp=run.config.mesh.pp,
    )


def run_config(run: Run, *, parameters: CostParameters | None = None) -> ParallelConfig:
    config = run.config
    mesh = config.mesh
    pipeline = run_pipeline(run, run_request(run), parameters)
    micro_batch, accumulation = config.local_batch_size, config.grad_accum_steps
    if pipeline is not None and config.pipeline is not None:
        # A pipeline splits the step's sequences into its micro-batches (the schedule's accumulation).
        sequences, accumulation = micro_batch * accumulation, config.pipeline.microbatches
        if sequences % accumulation:
            raise NotPriceable(
                f"{run.id}: config.pipeline.microbatches: {accumulation} do not split the step's "
                f"{sequences} sequences per data-parallel rank"
            )
        micro_batch = sequences // accumulation
    policy = _CHECKPOINTING[config.checkpointing.policy]
    compiled = config.compile != "none"
    engine = run_engine(run)
    reshard = config.reshard_after_forward
    if reshard is None:
        reshard = config.sharding in ("full_shard", "hybrid_shard")
    return ParallelConfig(
        sharding=config.sharding,
        mesh=mesh,
        blocks_per_unit=config.blocks_per_unit,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        reshard_after_forward=reshard,
        prefetch_depth=1,
        checkpointing=CheckpointingConfig(
            mode=policy, every_k=_every_k(run), blocks=config.checkpointing.blocks or 0  # type: ignore[arg-type]
        ),
        micro_batch_size=micro_batch,
        grad_accum_steps=accumulation,
        param_dtype="float32" if config.precision == "fp32" else "bfloat16",
        reduce_dtype="bfloat16" if config.reduce_dtype == "bf16" else "float32",
        compile=compiled,
        inductor=InductorConfig(
            bucket_all_gathers=False,
            bucket_reduce_scatters=False,
            reorder_for_compute_comm_overlap=compiled and engine == "fsdp-planner",
        ),
        loss_chunks=config.loss_chunks or 1,
        loss=_loss(run),  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
        async_tp=config.async_tp and compiled and mesh.tp > 1,
        pipeline=pipeline,
        float8=FLOAT8_RECIPES.get(config.precision, "none"),  # type: ignore[arg-type]
    )


def _loss(run: Run) -> str:
    if run.config.loss == "compiled" or (run.config.loss == "chunked" and run.config.loss_chunk_compiled):
        # Compiled, the upcast and the cross-entropy fuse: no fp32 copy of the logits, chunked or
        # not (each chunk's own bf16 gradient, one chunk at a time, is not priced).
        return "compiled_fp32"
    if run.config.loss != "chunked":
        return "autograd_fp32"
    return "sliced" if run_engine(run) == "fsdp-planner" else "chunked_fp32"


def _every_k(run: Run) -> int:
    # torchtitan's "selective layer" checkpoints every second block unless its config says otherwise.
    checkpointing = run.config.checkpointing
    return checkpointing.every_k or (2 if checkpointing.policy == "selective_layer" else 1)


def _expert_routing(routing: ExpertRouting, imbalance: float) -> dict[str, object]:
    """The cost parameters a run's expert routing sets (planner/cost/expert_dispatch.py): its dispatch,
    where a token's experts sit, the load imbalance (1 under a forced balance) and its experts' GEMM
    kernel's rate."""
    forced = routing.gate != "learned"
    routed = {
        "expert_dispatch": "deduplicated" if routing.dispatcher == "deepep" else "copies",
        "expert_placement": "contiguous" if routing.gate == "forced_contiguous" else "random",
        "expert_load_imbalance": 1.0 if forced else imbalance,
    }
    if routing.grouped_gemm == "vendor_blas":
        routed["grouped_gemm_efficiency"] = 1.0  # the vendor BLAS's GEMMs per expert: the dense rate
    return routed


class NotPriceable(PlanningError):
    """A run the planner cannot price as it was run (float8, pipeline or context parallelism)."""


def price_run(
    run: Run,
    *,
    calibration: CalibrationProfile | None = None,
    parameters: CostParameters | None = None,
) -> PricedRun:
    """The planner's prediction of `run` at its exact configuration.

    `parameters` replaces the cost parameters the request implies (to test a correction); raises
    NotPriceable for runs marked so, PlanningError when the configuration does not fit the planner's
    space (the message says which field).
    """
    if not run.priceable:
        raise NotPriceable(f"{run.id}: {run.not_priceable_reason}")
    return price_as_run(run, calibration=calibration, parameters=parameters)


def price_as_run(
    run: Run,
    *,
    calibration: CalibrationProfile | None = None,
    parameters: CostParameters | None = None,
) -> PricedRun:
    """`price_run` for any run the planner can express, marked priceable or not (Float8,
    pipelines, context parallelism: the report leaves them out while their pricing is checked by
    the benchmarks, but the memory margins of parallel dimensions read their measured peaks).
    Raises PlanningError when the configuration does not fit the planner's space."""
    request = run_request(run)
    speed = ATTENTION_KERNEL_SPEED[run.config.attention]
    if speed != 1.0:
        parameters = parameters or build_setting(request, calibration, None).params
        parameters = replace(parameters, attention_efficiency=parameters.attention_efficiency * speed)
    routing = run.config.experts
    if routing is not None:
        parameters = parameters or build_setting(request, calibration, None).params
        parameters = replace(parameters, **_expert_routing(routing, parameters.expert_load_imbalance))
    # The report places each run's interval itself (held-out runs calibrated without their source:
    # planner/fidelity/intervals.py), so the plan's own would be priced for nothing.
    config = run_config(run, parameters=parameters)
    plan = predict(request, config, calibration=calibration, parameters=parameters, intervals=False)
    margin = plan.prediction.memory_margin or 0.0
    return PricedRun(run=run, plan=plan, margin=margin)
