"""What the cost model prices: one point of the search space (`Choice`) in a fixed `Setting`.

`Choice` is the search's light-weight configuration (the Plan's `ParallelConfig` is built only for
the plans that are reported); `Setting` is what stays fixed across a search.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.model_costs import ModelCosts
from planner.cost.parameters import CostParameters
from planner.specs import Optimizer, Precision


@dataclass(frozen=True, slots=True)
class Choice:
    """One point of the search space."""

    sharding: str
    shard_group: int
    replicate_group: int
    blocks_per_unit: int
    all_gather_bucket_mb: float
    reduce_scatter_bucket_mb: float
    checkpointing: str
    every_k: int
    micro_batch: int
    grad_accum: int
    compile: bool
    prefetch_depth: int = 1
    loss_chunks: int = 1

    @property
    def family(self) -> str:
        shard = self.sharding
        if self.sharding == "hybrid_shard":
            shard += f"/{self.shard_group}x{self.replicate_group}"
        return f"{shard} {'compiled' if self.compile else 'eager'}"

    @property
    def reshards_after_forward(self) -> bool:
        return self.sharding in ("full_shard", "hybrid_shard")

    def is_checkpointed(self, block_index: int) -> bool:
        """Whether block `block_index` is recomputed whole in backward."""
        if self.checkpointing == "full":
            return True
        if self.checkpointing == "selective":
            return (block_index + 1) % self.every_k == 0
        return False


@dataclass(frozen=True, slots=True)
class Setting:
    """What stays fixed across the search: model, hardware, precision, batch."""

    model: ModelCosts
    params: CostParameters
    precision: Precision
    optimizer: Optimizer
    world_size: int
    gpus_per_node: int
    num_nodes: int
    seq_len: int
    global_batch_sequences: int

    @property
    def param_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    @property
    def act_bytes(self) -> int:
        return self.param_bytes
