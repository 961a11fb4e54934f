"""The corpus of measured training runs: what others (and this project) measured, with exact configurations.

One JSON file per source under `planner/fidelity/corpus/` (a repository document at a commit, a paper,
a vendor report, an issue thread, this project's own GPU measurements), each holding the source and its
runs. This module is the schema (strict pydantic models: a file that does not match is refused with
the field that is wrong) and the loader. Pricing the runs is planner/fidelity/pricing.py.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contract.mesh import Mesh
from contract.parallel_config import PipelineSchedule

CORPUS_PACKAGE = "planner.fidelity.corpus"

SourceKind = Literal["repository", "paper", "vendor-report", "blog", "issue", "own-measurement"]
CheckpointPolicy = Literal["none", "full", "selective_layer", "selective_op", "first_blocks"]
CompileScope = Literal["none", "per_block", "whole_model"]
RunPrecision = Literal["bf16", "float8_tensorwise", "float8_rowwise", "mxfp8", "fp16", "fp32"]
MemoryCounter = Literal["reserved", "allocated", "nvidia-smi", "unknown"]
AttentionKernel = Literal["flash2", "flash1", "aiter"]
Fraction = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class CorpusModel(BaseModel):
    """Strict and immutable: a corpus file means exactly what it says."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(CorpusModel):
    """Where the runs of one file were published."""

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")]
    """Kebab-case id; the file is `<id>.json`."""
    kind: SourceKind
    title: str
    publisher: str
    """Who published it: independence of sources is judged by publisher and document."""
    url: str
    repository: str | None = None
    path: str | None = None
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{7,40}$")] | None = None
    section: str | None = None
    date: Annotated[str, Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")]


class Hardware(CorpusModel):
    gpu: str
    """The planner's catalog name of the GPU type (the closest one)."""
    gpu_as_published: str
    memory_gb: Fraction | None = None
    """Card memory as deployed, GB as the vendor states it (e.g. 96 for torchtitan's H100s)."""
    power_limit_w: Fraction | None = None
    """Board power limit, where the source states one."""
    power_limit_unstated: bool = False
    """The source says its cards ran under a power cap but not at what limit: their clock, so the
    run's tokens/s, cannot be priced (its memory can, and so can its speed over the same source's
    runs on the same cards)."""
    gpus_per_node: Annotated[int, Field(ge=1)] | None = None
    """None when the source does not say: priced on the GPU type's standard node (8 GPUs)."""
    nodes: Annotated[int, Field(ge=1)] | None = None
    interconnect: str | None = None
    network_gbps_per_node: Fraction | None = None
    """Network bandwidth between nodes, Gb/s per node in each direction, where the source states it
    (per GPU x GPUs per node where it is given per GPU); None: the GPU type's usual network."""

    @model_validator(mode="after")
    def _one_power_limit(self) -> Hardware:
        if self.power_limit_unstated and self.power_limit_w is not None:
            raise ValueError("power_limit_unstated: the source states a limit (power_limit_w); drop one")
        return self


class Software(CorpusModel):
    framework: str
    framework_version: str | None = None
    torch: str | None = None


class ModelDims(CorpusModel):
    """A model given by its dimensions (when it is not a catalog model)."""

    name: str
    architecture: Literal["llama", "gpt2"]
    vocab_size: Annotated[int, Field(ge=1)]
    hidden_size: Annotated[int, Field(ge=1)]
    num_layers: Annotated[int, Field(ge=1)]
    num_heads: Annotated[int, Field(ge=1)]
    num_kv_heads: Annotated[int, Field(ge=1)] | None = None
    intermediate_size: Annotated[int, Field(ge=1)] | None = None
    tie_word_embeddings: bool = False
    max_seq_len: Annotated[int, Field(ge=1)] | None = None


class Pipeline(CorpusModel):
    """How a pipeline-parallel run scheduled its stages (where the mesh has pp > 1)."""

    as_published: str
    """The source's own words (schedule name, micro-batching), or where the defaults were read."""
    schedule: PipelineSchedule
    """The schedule as the planner names it (contract/parallel_config.py `PipelineSchedule`)."""
    stages_per_rank: Annotated[int, Field(ge=1)] = 1
    """Virtual stages per pipeline rank (1 for 1F1B)."""
    microbatches: Annotated[int, Field(ge=1)]
    """Pipeline micro-batches per optimizer step per data-parallel rank: the step's sequences
    (`local_batch_size` x `grad_accum_steps`) are split into this many (torchtitan's
    `pipeline_parallel_microbatches`, by default the pp degree; Megatron's accumulation steps)."""
    stage_blocks: tuple[Annotated[int, Field(ge=1)], ...] | None = None
    """Transformer blocks per stage in stage order (pp x stages_per_rank of them), where the source or
    the recipe it ran says how the trainer split them: Megatron-Core splits the blocks evenly unless
    its recipe accounts for the embedding and the loss or states a layout. None: the planner's
    time-balanced split (planner/cost/pipeline.py `balanced_stage_split`)."""


class Checkpointing(CorpusModel):
    as_published: str
    """The framework's own words for its policy."""
    policy: CheckpointPolicy
    every_k: Annotated[int, Field(ge=1)] | None = None
    """For `selective_layer`: every k-th block is checkpointed."""
    blocks: Annotated[int, Field(ge=1)] | None = None
    """For `first_blocks`: how many blocks are checkpointed whole, the model's first ones (Megatron-LM's
    `--recompute-method block --recompute-num-layers N`; "N of L blocks")."""

    @model_validator(mode="after")
    def _blocks_with_their_policy(self) -> Checkpointing:
        if (self.policy == "first_blocks") != (self.blocks is not None):
            raise ValueError("blocks: state the number of blocks checkpointed with policy first_blocks only")
        return self


class ExpertRouting(CorpusModel):
    """How a mixture-of-experts run moved its tokens to their experts (the model's routed experts and
    the mesh's `ep` say how many and over how many ranks; this says how they were reached)."""

    as_published: str
    """The source's own words (its dispatcher and gate settings), or where they were read."""
    dispatcher: Literal["all_to_all", "deepep"]
    """`all_to_all`: each routed row sent on its own (`all_to_all_single`: torchtitan's default,
    Megatron's `alltoall` dispatcher); `deepep`: DeepEP-class kernels (DeepEP, HybridEP, Megatron's
    `flex` dispatcher), which send a token once per destination rank and node (priced as the cost
    model's `deduplicated` dispatch, planner/cost/expert_dispatch.py)."""
    gate: Literal["learned", "forced_random", "forced_contiguous"]
    """`learned`: the model's router (priced at the planner's load imbalance); `forced_random`: a
    benchmark's forced balance from random scores (Megatron's `moe_router_force_load_balancing`);
    `forced_contiguous`: a benchmark gate giving token t the experts t*k .. t*k + k - 1 (NeMo
    AutoModel's `fake_balanced_gate`). Forced gates load every expert evenly (imbalance 1)."""
    grouped_gemm: Literal["torch", "vendor_blas"] = "torch"
    """The experts' GEMM kernel: `torch`, `torch._grouped_mm` (torchtitan, NeMo AutoModel's `torch_mm`
    experts; priced at `GROUPED_MM_EFFICIENCY` of the dense rate); `vendor_blas`, the vendor BLAS's
    GEMMs per expert (Transformer Engine's grouped linear layers in Megatron, the `grouped_gemm`
    package's `gmm` in NeMo AutoModel), priced as dense GEMMs of the same shapes."""


class RunConfig(CorpusModel):
    model: str | ModelDims
    seq_len: Annotated[int, Field(ge=1)]
    local_batch_size: Annotated[int, Field(ge=1)]
    """Sequences per GPU (per data-parallel rank) per micro-step, as published."""
    grad_accum_steps: Annotated[int, Field(ge=1)] = 1
    global_batch_size: Annotated[int, Field(ge=1)] | None = None
    mesh: Mesh
    """The run's degrees: the planner's own mesh (contract.mesh), so a run names the axes a plan does."""
    sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
    reshard_after_forward: bool | None = None
    checkpointing: Checkpointing
    blocks_per_unit: Annotated[int, Field(ge=1)] = 1
    """Transformer blocks per FSDP wrap unit (trainers that wrap every block: 1)."""
    compile: CompileScope
    loss: Literal["unchunked", "chunked", "compiled"] | None = None
    """None: not stated (priced as the trainer's plain cross-entropy on fp32 logits); `compiled`: that
    cross-entropy under torch.compile (torchtitan compiles it with the model since its commit
    bbb1b616e of 2025-04-02), fused so that no fp32 copy of the logits is held."""
    loss_chunks: Annotated[int, Field(ge=1)] | None = None
    """For a chunked loss: the number of chunks."""
    loss_chunk_compiled: bool = False
    """For a chunked loss: each chunk's upcast and cross-entropy run under torch.compile (torchtune's
    `compile_loss` on `CEWithChunkedOutputLoss.compute_cross_entropy`). Fused, a chunk holds no fp32
    copy of its logits, as `compiled` does for the whole loss; priced as that loss."""
    precision: RunPrecision
    reduce_dtype: Literal["fp32", "bf16"] | None = None
    """The dtype gradients are reduced in (None: not stated; priced as fp32, FSDP2's default)."""
    master_dtype: Literal["fp32", "bf16"] = "fp32"
    """The dtype of what the optimizer updates: `fp32` master parameters, gradients and optimizer
    states beside the compute copies (mixed precision); `bf16` for pure bf16 training (parameters,
    gradients and AdamW's states in bf16, no fp32 master; needs precision bf16), priced as the
    planner's `training.state_dtype` bfloat16."""
    async_tp: bool = False
    attention: AttentionKernel = "flash2"
    """The attention kernel's generation: `flash2` for FlashAttention-2-class kernels (flash-attn 2.x,
    torch SDPA's flash and cuDNN backends, what the planner's own runtimes use); `flash1` for the
    first generation (flash-attn 1.x and its Triton port, llm-foundry's `attn_impl: triton`); `aiter`
    for AMD's AITER kernels on Instinct GPUs (what Primus-Turbo's `use_turbo_attention` runs), against
    which torch's own flash op on ROCm is the catalog's figure."""
    pipeline: Pipeline | None = None
    """The pipeline's schedule (runs with mesh.pp > 1)."""
    experts: ExpertRouting | None = None
    """How the tokens reached their experts (runs of mixture-of-experts models; None: a dense model,
    or an MoE run priced as torchtitan routes: all-to-all copies, a learned router)."""
    engine: str
    """The trainer as the source names it (`torchtitan-fsdp2`, `fsdp1`, `project-simplefsdp`, ...)."""


class Measured(CorpusModel):
    tokens_per_s_per_gpu: Fraction | None = None
    mfu_percent: Annotated[float, Field(gt=0, le=100)] | None = None
    peak_memory_gib: Fraction | None = None
    memory_counter: MemoryCounter = "unknown"
    memory_percent_of_device: Annotated[float, Field(gt=0, le=100)] | None = None
    memory_not_comparable: str | None = None
    """Why the measured peak cannot be set against the planner's (None: it can): the run does something
    to memory that no planner option expresses (a trainer without FSDP, a loss kept in bf16) and that
    moves the peak by more than the memory target. The peak stays in the corpus, its speed is priced."""
    throughput_not_comparable: str | None = None
    """Why the measured speed cannot be set against the planner's (None: it can), in the source's own
    words: the run measured a failure no plan is made to run into (an allocator thrashing at the
    device's ceiling, which the planner's memory margin keeps a plan away from). The speed stays in the
    corpus, its peak is compared."""


class Run(CorpusModel):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    quote: str
    """The source's own words the numbers come from."""
    hardware: Hardware
    software: Software
    config: RunConfig
    measured: Measured
    priceable: bool
    not_priceable_reason: str | None = None
    notes: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Run:
        hardware = self.hardware
        world = (hardware.gpus_per_node or 0) * (hardware.nodes or 0) or self.config.mesh.world_size
        if self.config.mesh.world_size != world:
            raise ValueError(
                f"config.mesh: {self.config.mesh.world_size} ranks, but the hardware has {world} GPUs"
            )
        if not self.priceable and not self.not_priceable_reason:
            raise ValueError("not_priceable_reason: say why a run cannot be priced")
        if self.config.master_dtype == "bf16" and self.config.precision in ("fp32", "fp16"):
            raise ValueError(
                f"config.master_dtype: bf16 (pure bf16 training) computes in bf16, but precision is "
                f"{self.config.precision}; state the run's precision as bf16 or its master dtype as fp32"
            )
        if self.config.loss_chunk_compiled and self.config.loss != "chunked":
            raise ValueError(
                f"config.loss_chunk_compiled: true describes a chunked loss, but loss is {self.config.loss}; "
                "state loss chunked with its loss_chunks, or loss compiled for a whole compiled loss"
            )
        return self

    @property
    def throughput_comparable(self) -> bool:
        """Whether its speed can be set against a prediction: it publishes tokens/s or MFU, on cards
        whose clock is known (not capped at an unstated power limit), and measured no failure
        (`Measured.throughput_not_comparable`)."""
        measured = self.measured
        has_speed = measured.tokens_per_s_per_gpu is not None or measured.mfu_percent is not None
        return has_speed and not self.hardware.power_limit_unstated and not measured.throughput_not_comparable


class SourceFile(CorpusModel):
    source: Source
    runs: tuple[Run, ...]

    @model_validator(mode="after")
    def _unique_runs(self) -> SourceFile:
        ids = [run.id for run in self.runs]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"runs: ids must be unique within a source; repeated: {', '.join(duplicates)}")
        return self


class CorpusError(ValueError):
    """A corpus file that does not match the schema (names the file and the field)."""


def parse_source_file(name: str, text: str) -> SourceFile:
    """One corpus file, validated; its source id must be its file name."""
    try:
        data: Any = json.loads(text)
        parsed = SourceFile.model_validate(data)
    except (json.JSONDecodeError, ValidationError) as error:
        raise CorpusError(f"{name}: {error}") from error
    if f"{parsed.source.id}.json" != name:
        raise CorpusError(f"{name}: source.id {parsed.source.id!r} must be the file's name without .json")
    return parsed


@cache
def load_corpus() -> tuple[SourceFile, ...]:
    """Every corpus file shipped with the planner, sorted by source id."""
    files = sorted(
        (entry for entry in resources.files(CORPUS_PACKAGE).iterdir() if entry.name.endswith(".json")),
        key=lambda entry: entry.name,
    )
    return tuple(parse_source_file(entry.name, entry.read_text(encoding="utf-8")) for entry in files)


def corpus_json_schema() -> dict[str, Any]:
    """The corpus file format as JSON Schema (documentation; the models above validate)."""
    return SourceFile.model_json_schema()
