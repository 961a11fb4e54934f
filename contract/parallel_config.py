"""The plan's chosen configuration, declared once: how to shard, wrap, checkpoint, batch and compile.

The planner writes these dataclasses into its pydantic Plan (pydantic validates them and exports their
JSON Schema, bounds and docstrings included), and the runtime reads them back with
`contract.plan_document.parse_plan`. A new field is added here and nowhere else; its `AtLeast`
bound holds however an instance is made (contract.fields).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from contract.fields import DOCUMENT_CONFIG, AtLeast, check_fields
from contract.mesh import Mesh

ShardingStrategy = Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
CheckpointMode = Literal["none", "selective", "op_selective", "full"]
DType = Literal["bfloat16", "float32"]
Float8Recipe = Literal["none", "tensorwise", "rowwise", "mxfp8"]
"""Float8 training of the blocks' linear layers (torchao): `none` (they compute in the plan's
precision); `tensorwise` (one scale per tensor: the fastest, and FSDP all-gathers the converted
weights in float8); `rowwise` (one scale per row: closer to bf16, slower GEMMs); `mxfp8` (blocks of
32 values sharing an exponent, on GPUs with MX tensor cores: B200)."""
LossImplementation = Literal["sliced", "autograd_fp32", "chunked_fp32"]
"""How the output projection and cross-entropy run: `sliced` is this project's loss (token slices,
each computing its gradients at once, executor/runtime/loss.py); `autograd_fp32` is the plain
`cross_entropy(logits.float(), targets)` over the whole micro-batch (torchtitan's loss, and this
project's before the sliced loss), which keeps vocabulary-sized tensors alive for all tokens;
`chunked_fp32` runs that cross-entropy over `loss_chunks` slices of the whole micro-batch's
compute-dtype logits (torchtitan's chunked cross-entropy: the output projection is not sliced)."""
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
    op-level SAC); `full`: every block recomputed from its input."""
    every_k: Annotated[int, AtLeast(1)] = 1
    """For `selective`: checkpoint blocks whose index is a multiple of k (k=2: half the blocks)."""

    def __post_init__(self) -> None:
        check_fields(self)


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


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """The chosen way to shard, wrap, checkpoint, batch and compile."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    sharding: ShardingStrategy
    """How the data-parallel dimensions hold parameters: full_shard (ZeRO-3), shard_grad_op
    (ZeRO-2), hybrid_shard (sharded within dp_shard, replicated across dp_replicate), no_shard
    (DDP-like)."""
    mesh: Mesh
    """The device mesh (dp_replicate x dp_shard x tp = world size): full_shard / shard_grad_op
    shard over every data-parallel rank (dp_replicate 1), no_shard over none (dp_shard 1)."""
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

    def __post_init__(self) -> None:
        check_fields(self)

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
        return document

    def label(self) -> str:
        """A short human-readable summary, e.g. `full_shard/8 tp2 u2 AC=sel2 mb2x4 compiled`."""
        shard = self.sharding
        if self.sharding == "hybrid_shard":
            shard += f"/{self.mesh.dp_shard}x{self.mesh.dp_replicate}"
        if self.mesh.cp > 1:
            shard += f" cp{self.mesh.cp}"
        if self.mesh.tp > 1:
            shard += f" tp{self.mesh.tp}"
        ac = {"none": "none", "full": "full", "op_selective": "op"}.get(
            self.checkpointing.mode, f"sel{self.checkpointing.every_k}"
        )
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


ADDED_FIELDS: dict[str, Any] = {"float8": "none", "async_tp": False}
ADDED_MESH_AXES = ("cp",)
"""Mesh axes added after schema 2.0 (degree 1 means what their absence meant)."""
"""`ParallelConfig` fields added after schema 2.0, with the value that means what their absence meant."""
