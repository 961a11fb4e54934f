"""Eager FSDP2 (`torch.distributed.fsdp.fully_shard`) per wrap unit: the plan's non-compiled path.

Units in forward order: the input embeddings, groups of `blocks_per_unit` blocks, the final norm +
head, and the root (whatever is left, e.g. a tied embedding/head weight, which must sit in a
single unit). no_shard and hybrid_shard use FSDP2's HSDP on the 2-D (dp_replicate, dp_shard) mesh;
for no_shard the shard dimension has size 1, which is DDP. Context-parallel ranks hold the same
parameters: their dim is folded into the shard dim (`dp_shard_cp`) or, for no_shard, the
replicas. Tensor-parallel parameters (DTensors on the tp mesh of the same root mesh) are sharded
further by FSDP2 itself, keeping their tp layout. Under expert parallelism every MoE block's routed
experts (DTensors on the ep mesh) are a unit of their own, sharded over the data-parallel ranks left
after ep (`experts_mesh`: torchtitan's `dp_shard_mod_ep`) before their block's unit takes the rest.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from executor.runtime.distributed import data_parallel_dims, data_parallel_mesh
from executor.runtime.models import ModelParts
from executor.runtime.models.moe import moe_layers


def fsdp2_mesh(mesh: DeviceMesh, sharding: str) -> DeviceMesh:
    """FSDP2's data-parallel submesh of the job's mesh. `fully_shard` shards over any 1-D mesh, so
    no_shard (replicas only) is spelled as HSDP with a shard dimension of size 1. With context
    parallelism the shard dim is `dp_shard_cp` (`data_parallel_dims`); no_shard's replicas are
    `dp_replicate_cp`, given its size-1 shard dim by unflattening (made once per mesh)."""
    if sharding == "no_shard":
        (replicas,) = data_parallel_dims(mesh, sharding)
        if replicas == "dp_replicate":
            return mesh["dp_replicate", "dp_shard"]
        made: dict[str, DeviceMesh] = mesh.__dict__.setdefault("_fsdp_planner_fsdp2", {})
        if sharding not in made:
            flat = data_parallel_mesh(mesh, sharding)
            made[sharding] = flat._unflatten(0, (flat.size(), 1), (replicas, "no_shard"))
        return made[sharding]
    return data_parallel_mesh(mesh, sharding)


def apply_fsdp2(
    model: nn.Module,
    *,
    parts: ModelParts,
    mesh: DeviceMesh,
    blocks_per_unit: int,
    reshard_after_forward: bool,
    prefetch_depth: int,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    experts_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Wrap `model` in place and return it (the root is an FSDPModule); `mesh` is `fsdp2_mesh`'s,
    `experts_mesh` the expert-parallel experts' (`expert_parallel.ExpertMeshes.data_parallel`)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    units: list[FSDPModule] = []
    if experts_mesh is not None:
        for layer in moe_layers(model):
            fully_shard(
                layer.experts, mesh=experts_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp
            )

    def shard(modules: list[nn.Module], *, reshard: bool) -> None:
        target: nn.Module | list[nn.Module] = modules[0] if len(modules) == 1 else modules
        fully_shard(target, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        units.append(modules[0])  # type: ignore[arg-type]  # now an FSDPModule

    if parts.inputs:
        shard(parts.inputs, reshard=reshard_after_forward)
    blocks = parts.blocks
    for start in range(0, len(blocks), blocks_per_unit):
        shard(blocks[start : start + blocks_per_unit], reshard=reshard_after_forward)
    if parts.outputs:
        # Backward starts with the head right after forward: resharding it would only re-gather.
        shard(parts.outputs, reshard=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    if prefetch_depth > 1:
        _explicit_prefetch(units, prefetch_depth)
    return model


def _explicit_prefetch(units: list[FSDPModule], depth: int) -> None:
    # FSDP2 prefetches one unit ahead implicitly; deeper prefetch needs explicit lists.
    for i, unit in enumerate(units):
        unit.set_modules_to_forward_prefetch(units[i + 1 : i + 1 + depth])
        unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - depth) : i])))
