"""The plan's chosen configuration, declared once: how to shard, wrap, checkpoint, batch and compile.

The planner writes these dataclasses into its pydantic Plan (pydantic validates them and exports their
JSON Schema, bounds and docstrings included), and the runtime reads them back with
`contract.plan_document.parse_plan`. A new field is added here and nowhere else; its `AtLeast`
bound holds however an instance is made (contract.fields).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from contract.fields import DOCUMENT_CONFIG, AtLeast, check_fields
from contract.mesh import ADDED_MESH_AXES, Mesh

ShardingStrategy = Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
CheckpointMode = Literal["none", "selective", "op_selective", "full", "blocks"]
DType = Literal["bfloat16", "float32"]
Float8Recipe = Literal["none", "tensorwise", "rowwise", "mxfp8"]
"""Float8 training of the blocks' linear layers (torchao): `none` (they compute in the plan's
precision); `tensorwise` (one scale per tensor: the fastest, and FSDP all-gathers the converted
weights in float8); `rowwise` (one scale per row: closer to bf16, slower GEMMs); `mxfp8` (blocks of
32 values sharing an exponent, on GPUs with MX tensor cores: B200)."""
LossImplementation = Literal["sliced", "autograd_fp32", "chunked_fp32", "compiled_fp32"]
"""How the output projection and cross-entropy run: `sliced` is this project's loss (token slices,
each computing its gradients at once, executor/runtime/loss.py); `autograd_fp32` is the plain
`cross_entropy(logits.float(), targets)` over the whole micro-batch (torchtitan's loss, and this
project's before the sliced loss), which keeps vocabulary-sized tensors alive for all tokens;
`chunked_fp32` runs that cross-entropy over `loss_chunks` slices of the whole micro-batch's
compute-dtype logits (torchtitan's chunked cross-entropy: the output projection is not sliced);
`compiled_fp32` is the plain cross-entropy under torch.compile (torchtitan's whenever it compiles,
since April 2025): inductor fuses the fp32 upcast and log-softmax, forward and backward, into
kernels that read the compute-dtype logits and write their compute-dtype gradient, so no fp32 copy
of the logits is ever held."""
PipelineSchedule = Literal["1F1B", "Interleaved1F1B", "ZBVZeroBubble"]
"""How a pipeline runs its micro-batches (torch.distributed.pipelining's schedule classes):
`1F1B` (one stage per rank; after a warm-up of pp - 1 forwards each rank alternates one forward and
one backward, so the first stage holds pp micro-batches' activations); `Interleaved1F1B` (each rank
holds `stages_per_rank` stages, looped: stage s on rank s mod pp, which cuts the bubble by that
factor for more point-to-point sends and more activations in flight); `ZBVZeroBubble` (two stages per
rank in a V: rank r holds stages r and 2pp - 1 - r; backward is split into the input gradient,
on the critical path, and the weight gradient, which fills the bubbles)."""
PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = typing.get_args(PipelineSchedule)
EAGER_ONLY_SCHEDULES: tuple[PipelineSchedule, ...] = ("ZBVZeroBubble",)
"""Schedules torch.distributed.pipelining refuses for compiled stage modules (its zero-bubble ones)."""
Engine = Literal["fsdp-planner", "torchtitan"]
"""The training runtime a configuration runs on, because runtimes differ in what they keep in memory
and how they overlap: `fsdp-planner` is this project's trainer (compiled: SimpleFSDP over
torch.compile of the whole model; eager: FSDP2 `fully_shard`; the loss sliced so one slice's logits
are alive at a time); `torchtitan` is torchtitan's FSDP2 trainer (FSDP2 units per block whether or
not blocks are compiled, torch.compile per block, the loss over the whole micro-batch's fp32 logits).
Plans the service emits launchers for use `fsdp-planner`; the other engines are priced to compare
with runs measured on them (`fsdp-planner fidelity`)."""

@dataclass(frozen=True, slots=True)
class CheckpointingConfig:
    """Activation checkpointing policy."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    mode: CheckpointMode
    """`none`; `selective`: every `every_k`-th block recomputed; `op_selective`: in every block the
    outputs of every other matmul (and attention) are saved and the rest recomputed (torchtitan's
    op-level SAC); `full`: every block recomputed from its input; `blocks`: the first `blocks`
    blocks recomputed from their inputs, the rest not (any number of them, 50 of 80 say)."""
    every_k: Annotated[int, AtLeast(1)] = 1
    """For `selective`: checkpoint blocks whose index is a multiple of k (k=2: half the blocks)."""
    blocks: Annotated[int, AtLeast(0)] = 0
    """For `blocks`: how many blocks are recomputed, the model's first ones (Megatron-LM's
    `--recompute-method block`): in backward the blocks run last to first, so the activations of
    the blocks kept whole are freed before the checkpointed ones are recomputed."""

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.mode == "blocks") != (self.blocks > 0):
            raise ValueError(
                "checkpointing.blocks: give the number of blocks to recompute (at least 1) with mode "
                "`blocks`, and 0 with any other mode"
            )

    def label(self) -> str:
        """How a configuration's label names it: `none`, `full`, `op`, `sel2` (every 2nd block),
        `first50` (the first 50 blocks)."""
        if self.mode == "selective":
            return f"sel{self.every_k}"
        if self.mode == "blocks":
            return f"first{self.blocks}"
        return {"none": "none", "full": "full", "op_selective": "op"}[self.mode]


@dataclass(frozen=True, slots=True)
class InductorConfig:
    """torch.compile / inductor knobs implied by the plan (applied only when `compile` is on)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    bucket_all_gathers: bool
    """Merge consecutive all-gathers into buckets up to `all_gather_bucket_mb`."""
    bucket_reduce_scatters: bool
    """Merge consecutive reduce-scatters into buckets up to `reduce_scatter_bucket_mb`."""
    reorder_for_compute_comm_overlap: bool
    """Let inductor move collectives earlier so they overlap compute (prefetch)."""


class PipelineError(ValueError):
    """A pipeline that cannot run: the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """How the pipeline stages split the model and run (present exactly when `mesh.pp` > 1).

    Each optimizer step runs the schedule once over `grad_accum_steps` micro-batches of
    `micro_batch_size` sequences (the schedule's micro-batches are the plan's accumulation steps).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    schedule: PipelineSchedule
    """The schedule (`PipelineSchedule`)."""
    stages_per_rank: Annotated[int, AtLeast(1)]
    """Stages (virtual stages) each rank holds: 1 for `1F1B`, 2 or more for `Interleaved1F1B`, 2 for
    `ZBVZeroBubble`."""
    stage_blocks: tuple[int, ...]
    """Transformer blocks per stage, in stage order (pp x stages_per_rank stages, each at least one
    block, summing to the model's layers): the first stage also runs the embeddings, the last the
    final norm, the head and the loss, so the planner gives them fewer blocks to balance the time."""

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "stage_blocks", tuple(self.stage_blocks))  # a JSON list reads as one
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.stage_blocks):
            raise PipelineError(
                "stage_blocks: every stage needs a whole number of blocks >= 1, got "
                f"{list(self.stage_blocks)}"
            )
        expected = {"1F1B": "1", "ZBVZeroBubble": "2"}.get(self.schedule)
        if expected is not None and self.stages_per_rank != int(expected):
            raise PipelineError(
                f"stages_per_rank: {self.schedule} runs {expected} stage(s) per rank, got "
                f"{self.stages_per_rank}"
            )
        if self.schedule == "Interleaved1F1B" and self.stages_per_rank < 2:
            raise PipelineError(
                "stages_per_rank: Interleaved1F1B needs at least 2 stages per rank (with 1 it is 1F1B)"
            )

    @property
    def num_stages(self) -> int:
        return len(self.stage_blocks)

    def stage_ranks(self, pp: int) -> tuple[int, ...]:
        """The pipeline rank holding each stage: looped (stage s on rank s mod pp), or a V for
        `ZBVZeroBubble` (rank r holds stages r and 2pp - 1 - r, so the first and the last stage
        share rank 0)."""
        if self.schedule == "ZBVZeroBubble":
            return tuple(s if s < pp else 2 * pp - 1 - s for s in range(self.num_stages))
        return tuple(s % pp for s in range(self.num_stages))

    def stages_of(self, rank: int, pp: int) -> tuple[int, ...]:
        """The stages pipeline rank `rank` holds, in stage order."""
        return tuple(s for s, r in enumerate(self.stage_ranks(pp)) if r == rank)

    def first_blocks(self) -> tuple[int, ...]:
        """The index of each stage's first block (block indices run over the whole model)."""
        starts, total = [], 0
        for blocks in self.stage_blocks:
            starts.append(total)
            total += blocks
        return tuple(starts)

    def check(self, *, pp: int, grad_accum_steps: int, num_layers: int | None = None) -> None:
        """What the pipeline must agree with elsewhere in the plan: one stage group per pipeline
        rank x stages_per_rank, a number of micro-batches the schedule can run, every block placed.
        Messages name the `ParallelConfig` field."""
        if self.num_stages != pp * self.stages_per_rank:
            raise PipelineError(
                f"pipeline.stage_blocks: pp {pp} x stages_per_rank {self.stages_per_rank} = "
                f"{pp * self.stages_per_rank} stages, but {self.num_stages} are listed"
            )
        if grad_accum_steps < pp:
            raise PipelineError(
                f"grad_accum_steps: the pipeline's schedule runs it as micro-batches, and {pp} stages "
                f"need at least {pp} (got {grad_accum_steps}) to fill the pipeline"
            )
        if self.stages_per_rank > 1 and grad_accum_steps % pp:
            raise PipelineError(
                f"grad_accum_steps: {self.schedule} runs micro-batches in rounds of pp {pp}; "
                f"{grad_accum_steps} is not a multiple of it"
            )
        if num_layers is not None and sum(self.stage_blocks) != num_layers:
            raise PipelineError(
                f"pipeline.stage_blocks: {list(self.stage_blocks)} places {sum(self.stage_blocks)} "
                f"blocks, the model has {num_layers}"
            )

    def label(self) -> str:
        """E.g. `1F1B`, `Interleaved1F1Bx2`."""
        return self.schedule + (f"x{self.stages_per_rank}" if self.schedule == "Interleaved1F1B" else "")


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """The chosen way to shard, wrap, checkpoint, batch and compile."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    sharding: ShardingStrategy
    """How the data-parallel dimensions hold parameters: full_shard (ZeRO-3), shard_grad_op
    (ZeRO-2), hybrid_shard (sharded within dp_shard, replicated across dp_replicate), no_shard
    (DDP-like)."""
    mesh: Mesh
    """The device mesh (pp x dp_replicate x dp_shard x cp x tp = world size): full_shard /
    shard_grad_op shard over every data-parallel rank (dp_replicate 1), no_shard over none
    (dp_shard 1)."""
    blocks_per_unit: Annotated[int, AtLeast(1)]
    """Transformer blocks per FSDP wrap unit; embeddings and the output head are units of their own."""
    all_gather_bucket_mb: Annotated[float, AtLeast(0)]
    """Cap for merged all-gathers in MB; 0 means one collective per wrap unit."""
    reduce_scatter_bucket_mb: Annotated[float, AtLeast(0)]
    """Cap for merged reduce-scatters in MB; 0 means one collective per wrap unit."""
    reshard_after_forward: bool
    """Free unsharded parameters after a unit's forward (re-gathered in backward)."""
    prefetch_depth: Annotated[int, AtLeast(0)]
    """How many units ahead all-gathers are issued."""
    checkpointing: CheckpointingConfig
    """Activation checkpointing policy."""
    micro_batch_size: Annotated[int, AtLeast(1)]
    """Sequences per data-parallel rank per forward pass (the ranks of a tensor-parallel group
    share them)."""
    grad_accum_steps: Annotated[int, AtLeast(1)]
    """Micro-batches per optimizer step."""
    param_dtype: DType
    """Dtype of parameters in compute (all-gathered copies)."""
    reduce_dtype: DType
    """Dtype of gradient reduction."""
    compile: bool
    """torch.compile over SimpleFSDP-style DTensor sharding (True) or eager FSDP2 fully_shard (False)."""
    inductor: InductorConfig
    """Compiler knobs (used only when `compile` is on)."""
    loss_chunks: Annotated[int, AtLeast(1)] = 1
    """The output projection and cross-entropy run over this many slices of the micro-batch's tokens,
    each computing its gradients at once, so at most one slice's logits is alive at a time (1: the
    whole micro-batch's logits at once)."""
    loss: LossImplementation = "sliced"
    """How the output projection and cross-entropy run (`sliced`: this project's loss, the only one
    its runtime runs; `autograd_fp32`: the plain cross-entropy on fp32 logits, to price runs of
    other trainers)."""
    float8: Float8Recipe = "none"
    """Float8 training recipe of the blocks' linear layers (`none`: the plan's compute precision);
    the output head and layers too small to gain stay in the compute precision."""
    async_tp: bool = False
    """Asynchronous tensor parallelism (compiled plans with tp > 1 on CUDA): inductor splits each
    sequence all-gather and reduce-scatter around a block's matmuls into per-rank pieces over
    symmetric memory, so they overlap the matmuls they feed instead of waiting in front of them."""
    engine: Engine = "fsdp-planner"
    """The runtime this configuration is priced for: `fsdp-planner` (this project's trainer: the
    launchers run it) or `torchtitan` (torchtitan's FSDP2 trainer, with `compile` meaning
    torch.compile per block), to compare predictions with runs measured there."""
    pipeline: PipelineConfig | None = None
    """The pipeline's schedule and stage split when `mesh.pp` > 1 (null otherwise)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mesh.pp > 1 and self.pipeline is None:
            raise PipelineError(f"pipeline: mesh.pp is {self.mesh.pp}, so the stages and schedule are needed")
        if self.mesh.pp == 1 and self.pipeline is not None:
            raise PipelineError("pipeline: must be null when mesh.pp is 1 (no pipeline to run)")
        if self.pipeline is not None:
            self.pipeline.check(pp=self.mesh.pp, grad_accum_steps=self.grad_accum_steps)
            if self.checkpointing.mode == "blocks":
                raise PipelineError(
                    "checkpointing.mode: `blocks` recomputes the model's first blocks, which a pipeline "
                    "spreads over its stages; with a pipeline use `selective` (every k-th block) or `full`"
                )
            if self.compile and self.pipeline.schedule in EAGER_ONLY_SCHEDULES:
                raise PipelineError(
                    f"pipeline.schedule: {self.pipeline.schedule} splits each backward into the input's "
                    "and the weights' gradients, which torch runs only for stages that are not "
                    "compiled; use 1F1B or Interleaved1F1B with compile, or compile false"
                )

    def as_document(self) -> dict[str, Any]:
        """The JSON object the Plan document stores."""
        return dataclasses.asdict(self)

    def hashed_document(self) -> dict[str, Any]:
        """What a plan's hash covers for this fixed configuration: the document less the fields added
        since schema 2.0 where they hold the value a document without them meant (`ADDED_FIELDS`), so
        a configuration hashed before they existed hashes the same."""
        document = self.as_document()
        for name, neutral in ADDED_FIELDS.items():
            if document.get(name) == neutral:
                del document[name]
        for axis in ADDED_MESH_AXES:
            if document["mesh"].get(axis) == 1:
                del document["mesh"][axis]
        if document["checkpointing"].get("blocks") == 0:  # added after schema 2.0 too
            del document["checkpointing"]["blocks"]
        return document

    def label(self) -> str:
        """A short human-readable summary: the sharding and the whole mesh (`Mesh.label`), the
        pipeline's schedule, then the rest, e.g. `full_shard dp4x1 tp2 u2 AC=sel2 mb2x4 compiled`,
        `shard_grad_op pp4 dp8x1 tp8 Interleaved1F1Bx4 u1 AC=op mb1x64 eager`."""
        shard = f"{self.sharding} {self.mesh.label()}"
        if self.pipeline is not None:
            shard += f" {self.pipeline.label()}"
        ac = self.checkpointing.label()
        buckets = ""
        if self.compile and (self.all_gather_bucket_mb or self.reduce_scatter_bucket_mb):
            buckets = f" ag{self.all_gather_bucket_mb:g}/rs{self.reduce_scatter_bucket_mb:g}MB"
        mode = "compiled" if self.compile else "eager"
        if self.float8 != "none":
            mode = f"fp8-{self.float8} {mode}"
        if self.async_tp:
            mode = f"async-tp {mode}"
        if self.engine != "fsdp-planner":
            mode += f" [{self.engine}{', whole fp32 loss' if self.loss == 'autograd_fp32' else ''}]"
        elif self.loss != "sliced":
            mode += " [whole fp32 loss]"
        return (
            f"{shard} u{self.blocks_per_unit} AC={ac} mb{self.micro_batch_size}x{self.grad_accum_steps}"
            f"{buckets} {mode}"
        )


def config_family(sharding: str, mesh: Mesh, compile: bool) -> str:
    """A family of configurations as shown: sharding, whole mesh (`Mesh.label`) and compile mode,
    e.g. `hybrid_shard dp2x4 tp1 compiled`; the configurations' own labels begin alike."""
    return f"{sharding} {mesh.label()} {'compiled' if compile else 'eager'}"


ADDED_FIELDS: dict[str, Any] = {"float8": "none", "async_tp": False, "pipeline": None}
"""`ParallelConfig` fields added after schema 2.0, with the value that means what their absence meant."""
