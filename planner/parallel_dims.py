"""The parallel dimensions of a plan: one declaration of the device mesh, read by every layer.

Every parallel dimension is named here once (in the spirit of torchtitan's `ParallelDims`), and
each layer of the planner and runtime has one place for it: a search axis (planner/enumeration.py),
a cost term (planner/cost/estimate.py), a memory term (planner/cost/memory.py), a runtime apply
step (executor/runtime/parallelize.py) and a launcher flag (executor/launch). Adding a dimension
(context or pipeline parallelism) adds a field here and one entry in each of those places.

The mesh is laid out row-major over (dp_replicate, dp_shard, tp), the last innermost: a tensor-
parallel group is `tp` consecutive ranks, so it stays inside one node, and a data-parallel shard
group strides over them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

LinkClass = Literal["intra", "inter"]


class ParallelDims(BaseModel):
    """The degrees of the device mesh; their product is the world size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp_replicate: Annotated[int, Field(ge=1)] = 1
    """Data-parallel replicas: ranks holding the same parameter shard (hybrid_shard across nodes,
    no_shard across everything)."""
    dp_shard: Annotated[int, Field(ge=1)] = 1
    """Data-parallel ranks a parameter is sharded over (FSDP's shard group)."""
    tp: Annotated[int, Field(ge=1)] = 1
    """Tensor-parallel degree: ranks splitting every block's matmuls (Megatron column/row
    parallel), with sequence parallelism between them and a vocabulary-parallel loss when > 1."""

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
