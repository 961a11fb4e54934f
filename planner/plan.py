"""The Plan document as the planner writes it (pydantic): the versioned JSON the service stores and
the runtime reads.

Its schema version, its configuration (`ParallelConfig` and the mesh in it), its model's fields and
the upgrader that reads every older schema are the contract's (contract/): pydantic validates those
dataclasses here, the runtime reads the same document with the contract's own reader, and
tests/executor/test_plan_contract.py keeps the two readings in step.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.parallel_config import ParallelConfig
from contract.plan_document import SCHEMA_VERSION, upgrade_document
from planner.catalog.gpus import GpuSpec
from planner.cost.memory import MEMORY_TERMS
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec


class Document(BaseModel):
    """Base of the plan's parts: unknown keys refused, so a stored plan always means one thing."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


class ExpertMemory(Document):
    """A mixture-of-experts plan's peak memory per GPU, GiB, split into its routed experts', their
    dispatch buffers' and the dense parts' (planner/cost/expert_memory.py): parts of the same
    breakdown (`MemoryBreakdown`), at its moment, adding nothing to it. Added in schema 2.3."""

    routed_expert_states: float
    """Of the parameters, gradients and optimizer states: the routed experts' (FSDP shards them like
    the rest)."""
    routed_expert_gathered: float
    """Of the gathered parameters and gradient buffers: the routed experts'."""
    routed_expert_activations: float
    """Of the activations: the routed experts' own (their SwiGLU intermediates, the router's scores)."""
    dispatch_buffers: float
    """Of the activations: each token's rows gathered for its experts and the experts' outputs
    before the combine."""
    dense_parts: float
    """The rest of the peak: attention, dense and shared feed-forwards, embeddings, head, loss,
    workspace, allocator reserve."""


EXPERT_MEMORY_LABELS = {
    "routed_expert_states": "routed experts: params, grads, states",
    "routed_expert_gathered": "routed experts: gathered, grad buffers",
    "routed_expert_activations": "routed experts: activations",
    "dispatch_buffers": "dispatch buffers",
    "dense_parts": "dense parts (attention, shared, rest)",
}
"""`ExpertMemory`'s parts in its field order, in the words the command line and the plan page show."""


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


class PredictionInterval(Document):
    """Where the measured value of a predicted number falls `level` of the time (an 80% interval
    by default), from the cost model's errors on published runs that no fit read
    (planner/uncertainty.py); wider where the network was assumed."""

    low: float
    high: float
    level: float = 0.8
    """The share of held-out runs whose measurement an interval of this width contains."""
    basis: str = ""
    """Which held-out runs calibrated it, and what widened it (e.g. the network, where assumed)."""


class Prediction(Document):
    """What the cost model expects for one optimizer step of a configuration."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs utilisation (6N + 12LHQT per token) against the GPU's dense bf16 peak, 0..1."""
    peak_memory_gib: float
    """Predicted peak per GPU: what `torch.cuda.max_memory_reserved` reports over a step."""
    tokens_per_s_per_gpu_interval: PredictionInterval | None = None
    """Where the measured tokens/s/GPU falls (absent in plans stored before schema 2.2)."""
    peak_memory_gib_interval: PredictionInterval | None = None
    """Where the measured peak falls (absent in plans stored before schema 2.2)."""
    memory_breakdown_gib: MemoryBreakdown
    expert_memory_gib: ExpertMemory | None = None
    """A mixture-of-experts model's peak split into experts, dispatch buffers and dense parts (None:
    a dense model, or a plan stored before schema 2.3)."""
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
    """Tensor-parallel collectives per step (all exposed: they sit between the matmuls). Plans
    stored before schema 2.4 count the expert-parallel all-to-alls here too."""
    exposed_expert_parallel_s: float = 0.0
    """Expert parallelism's token dispatch and combine all-to-alls per step, forward, backward and
    recomputed (all exposed: the experts' GEMMs wait for their rows; in exposed_comm_s; 0 for dense
    plans and plans stored before schema 2.4)."""
    pipeline_bubble_s: float = 0.0
    """Time per step the busiest pipeline rank waits while the schedule fills and drains (in
    step_time_s, in neither compute_s nor exposed_comm_s)."""
    exposed_pipeline_p2p_s: float = 0.0
    """The pipeline's point-to-point sends per step on the critical path (in exposed_comm_s)."""
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
    tokens_per_s_per_gpu_interval: PredictionInterval | None = None
    """As the prediction's (absent in plans stored before schema 2.2)."""
    peak_memory_gib_interval: PredictionInterval | None = None


class RejectedFamily(Document):
    """Why a family of configurations (a sharding strategy x compile mode, or a model-parallel
    degree) was not chosen, told by the configuration that stands for it (planner/ranking.py)."""

    family: str
    """That configuration's sharding, whole mesh and compile mode, e.g. `no_shard dp1x2 tp4 eager`
    (`Choice.mesh_family`); plans stored by earlier versions name the family itself (`no_shard eager`,
    `tp=4`)."""
    kind: Literal["oom", "slower", "excluded"]
    reason: str
    """E.g. `OOM by 12.4 GiB` or `17% slower: exposed all-gather 41 ms/step`."""
    best_tokens_per_s_per_gpu: float | None = None
    min_peak_memory_gib: float | None = None
    memory_limit_gib: float | None = None
    """For `oom`: the largest peak that `min_peak_memory_gib`'s configuration could have had (its
    mesh's usable memory over one plus its memory margin); absent in plans stored before it."""


class PlanWarning(Document):
    """Something a person should know about a plan that fits (planner/plan_warnings.py)."""

    code: Literal[
        "communication_bound", "seq_len_beyond_max_position", "optimistic_throughput",
        "lead_within_interval", "network_assumed", "gpu_outside_corpus", "cluster_size_outside_corpus",
        "degree_outside_corpus", "float8_experts_in_bf16",
    ]
    """`communication_bound`: much of the step is exposed communication, which data parallelism
    alone cannot hide; `seq_len_beyond_max_position`: longer sequences than the model's positions;
    `optimistic_throughput`: published runs with a parallel dimension the plan uses (at its degree)
    ran slower than the model prices them; `lead_within_interval`: the runner-up's throughput is
    inside the pick's interval (schema 2.2 adds this and the next four); `network_assumed`: the
    cluster did not state its network; `gpu_outside_corpus`, `cluster_size_outside_corpus`,
    `degree_outside_corpus`: a GPU type, cluster size or parallel degree no priced run of the
    corpus reaches (planner/uncertainty.py); `float8_experts_in_bf16` (schema 2.4): a Float8 plan's
    routed experts' grouped GEMMs run and are priced in bf16."""
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
    active_params: int | None = None
    """Parameters a token runs: a mixture of experts' top-k routed experts, not all of them (N of 6N
    is these but the input embedding); None: every parameter (a dense model, or a plan stored before
    schema 2.3)."""
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
    network_assumed: bool | None = None
    """True where the cluster did not state its network between nodes and the plan priced the
    catalog's default (its throughput interval widened by what that unknown costs); None in plans
    stored before schema 2.2."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        # Older schemas are read through the contract's one upgrader (a PlanError is a ValueError:
        # pydantic reports it as this document's validation error).
        return upgrade_document(data) if isinstance(data, dict) and "schema_version" in data else data
