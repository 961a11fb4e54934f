"""The device mesh: every parallel dimension declared once, read by every layer.

In the spirit of torchtitan's `ParallelDims`, the mesh's axes are named here once (`MESH_AXES`), and
each layer has one place per axis: a search axis (planner/enumeration.py), a cost term
(planner/cost/estimate.py), a memory term (planner/cost/memory.py), a runtime apply step
(executor/runtime/parallelize.py), a launcher line (executor/launch/render.py) and a dashboard
column. tests/test_mesh_layers.py fails when a layer ignores an axis; the README's architecture
section has the checklist for adding one.

The mesh is laid out row-major over `MESH_AXES`, the last innermost: a tensor-parallel group is `tp`
consecutive ranks, so it stays inside one node, and a data-parallel shard group strides over them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

LinkClass = Literal["intra", "inter"]

MESH_AXES = ("dp_replicate", "dp_shard", "tp")
"""The mesh's axes, outermost first: the rank layout, and the runtime's DeviceMesh dimension names."""


class MeshError(ValueError):
    """A mesh that cannot be: the message names the axis and the fix."""


@dataclass(frozen=True, slots=True)
class Mesh:
    """The degrees of the device mesh; their product is the world size."""

    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}  # pydantic: unknown axes refused

    dp_replicate: int = 1
    """Data-parallel replicas: ranks holding the same parameter shard (hybrid_shard across nodes,
    no_shard across everything)."""
    dp_shard: int = 1
    """Data-parallel ranks a parameter is sharded over (FSDP's shard group)."""
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
        """The mesh of a JSON object `{dp_replicate, dp_shard, tp}` (a missing axis is 1). An axis this
        version does not know is accepted at degree 1 (no parallelism there: a newer planner's plan
        means the same) and refused above it, naming it."""
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
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: ranks that see different sequences."""
        return self.dp_replicate * self.dp_shard

    def shard_link(self, gpus_per_node: int) -> LinkClass:
        """The link FSDP's all-gathers and reduce-scatters cross: a shard group strides over the tp
        ranks, so it stays in a node while dp_shard x tp GPUs fit in one."""
        return "intra" if self.dp_shard * self.tp <= gpus_per_node else "inter"

    def label(self) -> str:
        """E.g. `dp 2x4 tp 2` (replicas x shards; tp omitted when 1)."""
        dp = f"{self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else f"{self.dp_shard}"
        return f"dp {dp}" + (f" tp {self.tp}" if self.tp > 1 else "")

    def describe(self) -> str:
        """`dp_replicate 1 x dp_shard 32 x tp 8 = 256 ranks`."""
        degrees = " x ".join(f"{axis} {getattr(self, axis)}" for axis in MESH_AXES)
        return f"{degrees} = {self.world_size} ranks"


def data_parallel_axes(sharding: str) -> tuple[str, ...]:
    """The mesh axes a sharding mode spreads data parallelism over: the shard group for full_shard
    and shard_grad_op (dp_replicate is 1), (dp_replicate, dp_shard) for hybrid_shard, the replicas
    for no_shard (dp_shard is 1)."""
    if sharding in ("full_shard", "shard_grad_op"):
        return ("dp_shard",)
    if sharding == "hybrid_shard":
        return ("dp_replicate", "dp_shard")
    if sharding == "no_shard":
        return ("dp_replicate",)
    raise MeshError(
        f"unknown sharding {sharding!r}: one of full_shard, shard_grad_op, hybrid_shard, no_shard"
    )
