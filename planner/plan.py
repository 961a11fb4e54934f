"""The Plan document as the planner writes it (pydantic): the versioned JSON the service stores and
the runtime reads.

Its schema version, its mesh and the upgrader that reads every older schema are the contract's
(contract.plan_document, contract.mesh): the runtime reads the same document with the contract's
dataclasses, and tests/executor/test_plan_contract.py keeps the two readings in step.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.mesh import Mesh
from contract.plan_document import SCHEMA_VERSION, upgrade_document
from planner.catalog.gpus import GpuSpec
from planner.cost.memory import MEMORY_TERMS
from planner.specs import (
    CheckpointMode,
    ClusterSpec,
    Engine,
    LossImplementation,
    ModelSpec,
    ShardingStrategy,
    TrainingSpec,
)

DType = Literal["bfloat16", "float32"]


class Document(BaseModel):
    """Base of the plan's parts: unknown keys refused, so a stored plan always means one thing."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckpointingConfig(Document):
    """Activation checkpointing policy."""

    mode: CheckpointMode
    """`none`; `selective`: every `every_k`-th block recomputed; `op_selective`: in every block the
    outputs of every other matmul (and attention) are saved and the rest recomputed (torchtitan's
    op-level SAC); `full`: every block recomputed from its input."""
    every_k: Annotated[int, Field(ge=1)] = 1
    """For `selective`: checkpoint blocks whose index is a multiple of k (k=2: half the blocks)."""


class InductorConfig(Document):
    """torch.compile / inductor knobs implied by the plan (applied only when `compile` is on)."""

    bucket_all_gathers: bool
    """Merge consecutive all-gathers into buckets up to `all_gather_bucket_mb`."""
    bucket_reduce_scatters: bool
    """Merge consecutive reduce-scatters into buckets up to `reduce_scatter_bucket_mb`."""
    reorder_for_compute_comm_overlap: bool
    """Let inductor move collectives earlier so they overlap compute (prefetch)."""


class ParallelConfig(Document):
    """The chosen way to shard, wrap, checkpoint, batch and compile."""

    sharding: ShardingStrategy
    """How the data-parallel dimensions hold parameters: full_shard (ZeRO-3), shard_grad_op
    (ZeRO-2), hybrid_shard (sharded within dp_shard, replicated across dp_replicate), no_shard
    (DDP-like)."""
    mesh: Mesh
    """The device mesh (dp_replicate x dp_shard x tp = world size): full_shard / shard_grad_op
    shard over every data-parallel rank (dp_replicate 1), no_shard over none (dp_shard 1)."""
    blocks_per_unit: Annotated[int, Field(ge=1)]
    """Transformer blocks per FSDP wrap unit; embeddings and the output head are units of their own."""
    all_gather_bucket_mb: Annotated[float, Field(ge=0)]
    """Cap for merged all-gathers in MB; 0 means one collective per wrap unit."""
    reduce_scatter_bucket_mb: Annotated[float, Field(ge=0)]
    """Cap for merged reduce-scatters in MB; 0 means one collective per wrap unit."""
    reshard_after_forward: bool
    """Free unsharded parameters after a unit's forward (re-gathered in backward)."""
    prefetch_depth: Annotated[int, Field(ge=0)]
    """How many units ahead all-gathers are issued."""
    checkpointing: CheckpointingConfig
    micro_batch_size: Annotated[int, Field(ge=1)]
    """Sequences per data-parallel rank per forward pass (the ranks of a tensor-parallel group
    share them)."""
    grad_accum_steps: Annotated[int, Field(ge=1)]
    """Micro-batches per optimizer step."""
    param_dtype: DType
    """Dtype of parameters in compute (all-gathered copies)."""
    reduce_dtype: DType
    """Dtype of gradient reduction."""
    compile: bool
    """torch.compile over SimpleFSDP-style DTensor sharding (True) or eager FSDP2 fully_shard (False)."""
    inductor: InductorConfig
    loss_chunks: Annotated[int, Field(ge=1)] = 1
    """The output projection and cross-entropy run over this many slices of the micro-batch's tokens,
    each computing its gradients at once, so at most one slice's logits is alive at a time (1: the
    whole micro-batch's logits at once)."""
    loss: LossImplementation = "sliced"
    """How the output projection and cross-entropy run (`sliced`: this project's loss, the only one
    its runtime runs; `autograd_fp32`: the plain cross-entropy on fp32 logits, to price runs of
    other trainers)."""
    engine: Engine = "fsdp-planner"
    """The runtime this configuration is priced for: `fsdp-planner` (this project's trainer: the
    launchers run it) or `torchtitan` (torchtitan's FSDP2 trainer, with `compile` meaning
    torch.compile per block), to compare predictions with runs measured there."""

    def label(self) -> str:
        """A short human-readable summary, e.g. `full_shard/8 tp2 u2 AC=sel2 mb2x4 compiled`."""
        shard = self.sharding
        if self.sharding == "hybrid_shard":
            shard += f"/{self.mesh.dp_shard}x{self.mesh.dp_replicate}"
        if self.mesh.tp > 1:
            shard += f" tp{self.mesh.tp}"
        ac = {"none": "none", "full": "full", "op_selective": "op"}.get(
            self.checkpointing.mode, f"sel{self.checkpointing.every_k}"
        )
        buckets = ""
        if self.compile and (self.all_gather_bucket_mb or self.reduce_scatter_bucket_mb):
            buckets = f" ag{self.all_gather_bucket_mb:g}/rs{self.reduce_scatter_bucket_mb:g}MB"
        mode = "compiled" if self.compile else "eager"
        if self.engine != "fsdp-planner":
            mode += f" [{self.engine}{', whole fp32 loss' if self.loss == 'autograd_fp32' else ''}]"
        elif self.loss != "sliced":
            mode += " [whole fp32 loss]"
        return (
            f"{shard} u{self.blocks_per_unit} AC={ac} mb{self.micro_batch_size}x{self.grad_accum_steps}"
            f"{buckets} {mode}"
        )


def _term(name: str) -> Any:
    return Field(description=MEMORY_TERMS[name].meaning)


class MemoryBreakdown(Document):
    """Peak memory per GPU by purpose, GiB: what is alive at the moment of the peak.

    The terms are planner/cost/memory.py's MEMORY_TERMS, the same estimate the search pruned with.
    """

    params: Annotated[float, _term("params")]
    grads: Annotated[float, _term("grads")]
    optimizer: Annotated[float, _term("optimizer")]
    activations: Annotated[float, _term("activations")]
    unsharded_params: Annotated[float, _term("unsharded_params")]
    grad_buffers: Annotated[float, _term("grad_buffers")]
    logits: Annotated[float, _term("logits")]
    workspace: Annotated[float, _term("workspace")]
    allocator_reserve: Annotated[float, _term("allocator_reserve")]
    moment: Literal["loss", "backward start", "backward recompute", "optimizer step"] = "backward start"
    """When in the step the peak happens."""

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in MEMORY_TERMS)


class TimelineSegment(Document):
    """One span on the step timeline (one micro-batch, forward then backward)."""

    stream: Literal["compute", "comm"]
    phase: Literal["forward", "backward", "optimizer"]
    label: str
    """What runs, e.g. `fwd unit 3` or `all-gather bucket 2`."""
    start_s: float
    end_s: float
    exposed_s: float = 0.0
    """For communication: the part of it during which compute waited."""


class Prediction(Document):
    """What the cost model expects for one optimizer step of a configuration."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs utilisation (6N + 12LHQT per token) against the GPU's dense bf16 peak, 0..1."""
    peak_memory_gib: float
    """Predicted peak per GPU: what `torch.cuda.max_memory_reserved` reports over a step."""
    memory_breakdown_gib: MemoryBreakdown
    usable_memory_gib: float | None = None
    """What the allocator can obtain per GPU: capacity less the CUDA context and NCCL (and less the
    request's extra headroom)."""
    memory_margin: float | None = None
    """Headroom kept on top of the predicted peak, as a fraction of it (the plan fits when
    peak x (1 + margin) <= usable)."""
    memory_margin_reason: str | None = None
    """Where the margin comes from: the memory model's measured error, or the calibration's fit."""
    compute_s: float
    """Compute time per step (forward, backward, recompute, optimizer, framework overhead)."""
    comm_s: float
    """Total communication time per step, overlapped or not."""
    exposed_comm_s: float
    """Communication time per step not hidden behind compute."""
    exposed_all_gather_s: float
    exposed_reduce_scatter_s: float
    exposed_tensor_parallel_s: float = 0.0
    """Tensor-parallel collectives per step (all exposed: they sit between the matmuls)."""
    optimizer_s: float
    overhead_s: float = 0.0
    """Framework time per step outside the priced kernels (hooks, Python), from timed steps; in compute_s."""
    timeline: tuple[TimelineSegment, ...] = ()
    """One micro-batch's forward and backward on the two streams (only for the chosen plan)."""


class Candidate(Document):
    """A ranked configuration with its prediction (alternatives and the Pareto front)."""

    label: str
    config: ParallelConfig
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    peak_memory_gib: float
    exposed_comm_s: float
    relative_throughput: float
    """Throughput relative to the chosen plan (1.0 = as fast)."""


class RejectedFamily(Document):
    """Why a family of configurations (a sharding strategy x compile mode) was not chosen."""

    family: str
    """E.g. `no_shard eager`."""
    kind: Literal["oom", "slower", "excluded"]
    reason: str
    """E.g. `OOM by 12.4 GiB` or `17% slower: exposed all-gather 41 ms/step`."""
    best_tokens_per_s_per_gpu: float | None = None
    min_peak_memory_gib: float | None = None


class PlanWarning(Document):
    """Something a person should know about a plan that fits (planner/plan_warnings.py)."""

    code: Literal["communication_bound", "seq_len_beyond_max_position"]
    """`communication_bound`: much of the step is exposed communication, which data parallelism
    alone cannot hide; `seq_len_beyond_max_position`: longer sequences than the model's positions."""
    message: str
    """What is wrong, with the numbers, and what would help."""


class SearchStats(Document):
    candidates_evaluated: int
    candidates_fitting: int


class PlannedModel(ModelSpec):
    """The model spec with its derived counts."""

    num_params: int
    num_params_embedding: int
    """Input-embedding parameters (lookups, not matmuls; excluded from 6N)."""
    flops_per_token: float
    """Training FLOPs per token at this plan's sequence length: 6N + 12LHQT."""


# The derived counts are stored fields here (so the JSON carries them) and properties on the specs;
# pydantic warns about the shadowing, which is intended.
warnings.filterwarnings("ignore", message='Field name "(world_size|global_batch_sequences)"')


class PlannedCluster(ClusterSpec):
    """The cluster spec with its resolved GPU entry."""

    world_size: int
    gpu_spec: GpuSpec


class PlannedTraining(TrainingSpec):
    global_batch_sequences: int


class Plan(Document):
    """The versioned plan document (`schema_version`)."""

    schema_version: str = SCHEMA_VERSION
    planner_version: str
    plan_hash: str
    """sha256 of the canonical inputs, calibration id and planner version."""
    model: PlannedModel
    cluster: PlannedCluster
    training: PlannedTraining
    config: ParallelConfig
    prediction: Prediction
    alternatives: tuple[Candidate, ...]
    pareto_front: tuple[Candidate, ...]
    """Configurations that no other beats on both throughput and peak memory, fastest first."""
    rejected: tuple[RejectedFamily, ...]
    calibration_id: str | None = None
    search: SearchStats
    warnings: tuple[PlanWarning, ...] = ()
    """What to know before running it (empty when nothing stands out); added in schema 1.2."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        # Older schemas are read through the contract's one upgrader (a PlanError is a ValueError:
        # pydantic reports it as this document's validation error).
        return upgrade_document(data) if isinstance(data, dict) and "schema_version" in data else data
