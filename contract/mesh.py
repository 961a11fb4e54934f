"""The device mesh: every parallel dimension declared once, read by every layer.

In the spirit of torchtitan's `ParallelDims`, the mesh's axes are named here once (`MESH_AXES`), and
each layer has one place per axis: a search axis (planner/enumeration.py), a cost term
(planner/cost/estimate.py), a memory term (planner/cost/memory.py), a runtime apply step
(executor/runtime/parallelize.py), a launcher line (executor/launch/render.py) and a dashboard
column. tests/test_mesh_layers.py fails when a layer ignores an axis; the README's architecture
section has the checklist for adding one.

The mesh is laid out row-major over `MESH_AXES`, the last innermost: a tensor-parallel group is `tp`
consecutive ranks, so it stays inside one node, a context-parallel group the next `cp x tp`, a
data-parallel shard group strides over them, and pipeline stages are the outermost blocks of
`world / pp` ranks each (the stages' point-to-point sends are what crosses the slow links).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

LinkClass = Literal["intra", "inter"]

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The mesh's axes, outermost first: the rank layout, and the runtime's DeviceMesh dimension names."""
OPTIONAL_AXES = ("pp", "cp")
"""Axes a mesh's description names only above 1 (added after the others, rarely used)."""
SHARD_AXES = ("dp_shard", "cp")
"""The axes FSDP shards parameters over (torchtitan's `dp_shard_cp`): a context-parallel group holds
the same parameters, so its ranks share the shards too."""


class MeshError(ValueError):
    """A mesh that cannot be: the message names the axis and the fix."""


@dataclass(frozen=True, slots=True)
class Mesh:
    """The degrees of the device mesh; their product is the world size."""

    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}  # pydantic: unknown axes refused

    pp: int = 1
    """Pipeline-parallel degree: ranks holding consecutive stages of the model's blocks (the first
    with the embeddings, the last with the final norm and the head), each micro-batch's activations
    sent forward and their gradients back between neighbours (`ParallelConfig.pipeline` says how)."""
    dp_replicate: int = 1
    """Data-parallel replicas: ranks holding the same parameter shard (hybrid_shard across nodes,
    no_shard across everything)."""
    dp_shard: int = 1
    """Data-parallel ranks a parameter is sharded over (FSDP's shard group, with the cp ranks)."""
    cp: int = 1
    """Context-parallel degree: ranks splitting every sequence (load-balanced chunks for the causal
    mask), each attending its queries to the keys and values all-gathered from the others; they hold
    the same parameters, which FSDP shards over dp_shard x cp."""
    tp: int = 1
    """Tensor-parallel degree: ranks splitting every block's matmuls (Megatron column/row
    parallel), with sequence parallelism between them and a vocabulary-parallel loss when > 1."""

    def __post_init__(self) -> None:
        for axis in MESH_AXES:
            degree = getattr(self, axis)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise MeshError(f"{axis} must be a whole number >= 1, got {degree!r}")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """pydantic's hook (duck-typed: no import): the JSON Schema states each degree's bound."""
        schema = handler.resolve_ref_schema(handler(core_schema))
        for axis in MESH_AXES:
            schema["properties"][axis]["minimum"] = 1
        return schema

    @classmethod
    def from_document(cls, document: Any, *, where: str = "mesh") -> Mesh:
        """The mesh of a JSON object `{pp, dp_replicate, dp_shard, cp, tp}` (a missing axis is 1).
        An axis this version does not know is accepted at degree 1 (no parallelism there: a newer
        planner's plan means the same) and refused above it, naming it."""
        if not isinstance(document, dict):
            raise MeshError(f"{where} must be an object with {', '.join(MESH_AXES)}")
        unknown = sorted(axis for axis, degree in document.items() if axis not in MESH_AXES and degree != 1)
        if unknown:
            raise MeshError(
                f"{where} has axes this version cannot run ({', '.join(unknown)}); it knows "
                f"{', '.join(MESH_AXES)}: use a launcher bundle made by the planner that made the plan"
            )
        try:
            return cls(**{axis: degree for axis, degree in document.items() if axis in MESH_AXES})
        except MeshError as exc:
            raise MeshError(f"{where}.{exc}") from None

    def as_document(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @property
    def shape(self) -> tuple[int, ...]:
        """The degrees in `MESH_AXES` order: the runtime's DeviceMesh shape."""
        return tuple(getattr(self, axis) for axis in MESH_AXES)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: ranks that see different sequences."""
        return self.dp_replicate * self.dp_shard

    @property
    def model_parallel(self) -> int:
        """Ranks that share one data-parallel rank's sequences (pp x cp x tp)."""
        return self.pp * self.cp * self.tp

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage (the whole world when pp is 1)."""
        return self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def fsdp_shards(self) -> int:
        """Ranks a parameter is sharded over: dp_shard x cp (`SHARD_AXES`)."""
        return self.dp_shard * self.cp

    def shard_link(self, gpus_per_node: int) -> LinkClass:
        """The link FSDP's all-gathers and reduce-scatters cross: a shard group strides over the tp
        ranks, so it stays in a node while dp_shard x cp x tp GPUs fit in one."""
        return "intra" if self.fsdp_shards * self.tp <= gpus_per_node else "inter"

    def context_link(self, gpus_per_node: int) -> LinkClass:
        """The link the context-parallel all-gathers cross: a cp group is cp x tp consecutive ranks
        (tp innermost), inside a node while they fit in one."""
        return "intra" if self.cp * self.tp <= gpus_per_node else "inter"

    def pipeline_link(self, gpus_per_node: int) -> LinkClass:
        """The link the pipeline's slowest point-to-point send crosses: stages are the outermost
        blocks of `stage_ranks` ranks, so some neighbours sit on different nodes unless the whole
        pipeline fits in one."""
        return "intra" if self.world_size <= gpus_per_node else "inter"

    def label(self) -> str:
        """The one way a mesh is shown, e.g. `dp8x1 tp1`, `pp4 dp2x4 cp2 tp2`: both data-parallel
        degrees as dp_shard x dp_replicate and tp always, pp and cp when above 1, outermost first.
        Configurations (`ParallelConfig.label`), the planner's families (`config_family`) and the
        dashboard's plan list show meshes through it."""
        pipeline = [f"pp{self.pp}"] if self.pp > 1 else []
        context = [f"cp{self.cp}"] if self.cp > 1 else []
        return " ".join([*pipeline, f"dp{self.dp_shard}x{self.dp_replicate}", *context, f"tp{self.tp}"])

    def describe(self) -> str:
        """`dp_replicate 1 x dp_shard 32 x tp 8 = 256 ranks` (pp and cp named when above 1)."""
        axes = [axis for axis in MESH_AXES if axis not in OPTIONAL_AXES or getattr(self, axis) > 1]
        degrees = " x ".join(f"{axis} {getattr(self, axis)}" for axis in axes)
        return f"{degrees} = {self.world_size} ranks"


def data_parallel_axes(sharding: str) -> tuple[str, ...]:
    """The mesh axes a sharding mode spreads parameters and gradient reduction over: the shard
    group (dp_shard x cp) for full_shard and shard_grad_op (dp_replicate is 1), (dp_replicate,
    dp_shard, cp) for hybrid_shard, the replicas and the cp group for no_shard (dp_shard is 1).
    The cp ranks hold the same parameters as data-parallel ranks do (their gradients are reduced
    over them too); only the sequences they read are split differently."""
    if sharding in ("full_shard", "shard_grad_op"):
        return SHARD_AXES
    if sharding == "hybrid_shard":
        return ("dp_replicate", *SHARD_AXES)
    if sharding == "no_shard":
        return ("dp_replicate", "cp")
    raise MeshError(
        f"unknown sharding {sharding!r}: one of full_shard, shard_grad_op, hybrid_shard, no_shard"
    )
