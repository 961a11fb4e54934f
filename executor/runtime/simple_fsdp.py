"""SimpleFSDP-style data parallelism: parameters are DTensors, gathered in forward by a parametrization.

Following SimpleFSDP (arXiv 2411.00284): every parameter is stored as a DTensor sharded on the
data-parallel mesh, and each module's parameter *attribute* becomes a property that redistributes
the shard to a replicated tensor (an all-gather) and hands the local full tensor to the module's
code. Because the collective is ordinary traced code, torch.compile sees it: AOTAutograd derives
the backward (the gradient of Shard->Replicate is Partial->Shard: a reduce-scatter) and inductor
can bucket and reorder the collectives. Gradients land as DTensors on the parameters, so the
optimizer, gradient clipping and distributed checkpointing work on shards.

Modes (placements per mesh dimension):
  full_shard     Shard(0)               all-gather in forward, recomputed in backward (resharded)
  shard_grad_op  Shard(0)               gathered parameters are kept for backward (no re-gather)
  hybrid_shard   (Replicate, Shard(0))  gather in the shard group; gradients reduce-scattered in the
                                        shard group and all-reduced across replicas
  no_shard       Replicate              nothing to gather; gradients all-reduced (DDP)

"Resharding after forward" is expressed the SimpleFSDP way: the gather runs under selective
activation checkpointing whose policy forces the collective to be recomputed, so the compiled
partitioner re-gathers in backward instead of keeping the unsharded weight alive. In eager mode
autograd would keep the gathered weight anyway (the matmul saves it), so the policy is only
applied when compiling; eager SimpleFSDP therefore behaves like shard_grad_op memory-wise.

With tensor parallelism (applied first, `executor.runtime.tensor_parallel`) a parameter arrives as
a DTensor on the tp mesh. It is stored as one DTensor on the combined (data-parallel dims..., tp)
mesh: the data-parallel placements above, then its tp placement. When tp already shards dim 0
(column-parallel weights, the vocabulary-sharded embedding and head), the data-parallel shard is a
chunk *of the tp chunk*, which DTensor spells `_StridedShard(0, split_factor=tp)` (what FSDP2 does
too). Its gather all-gathers over the data-parallel dims only and hands the module a DTensor on the
tp mesh, still tp-sharded, so the tensor-parallel layers compute as they would without FSDP.
Expert-parallel experts (DTensors on the ep or (ep, expert_tp) mesh, `expert_parallel`) are stored
the same way on their own combined mesh, (the data-parallel ranks left after ep..., ep[, expert_tp]):
gathered over `dp_shard_mod_ep` only, handed to the experts as their ep (and tp) shard.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from executor.runtime.distributed import data_parallel_mesh

# DTensor.redistribute(forward_dtype=, backward_dtype=) is recent; without it, cast before gathering.
_REDISTRIBUTE_CASTS = "forward_dtype" in inspect.signature(DTensor.redistribute).parameters

# Ops that make up a parameter gather: recomputing them in backward is what "reshard" means.
_GATHER_OPS = {
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.wait_tensor.default,
    torch.ops.aten._to_copy.default,  # the param_dtype cast before the gather
}


@dataclass(frozen=True, slots=True)
class Layout:
    """Placements of one sharding mode on its mesh."""

    param: tuple[Placement, ...]
    """How the stored (master) parameter is laid out."""
    compute: tuple[Placement, ...]
    """What forward computes with: replicated everywhere."""
    grad: tuple[Placement, ...]
    """What each rank's local gradient is: a partial average over the data-parallel ranks."""


def layout_for(sharding: str, mesh: DeviceMesh) -> Layout:
    """Placements for `sharding` on its data-parallel `mesh` (`distributed.data_parallel_mesh`:
    1-D, or 2-D (dp_replicate, dp_shard) for hybrid_shard; with context parallelism the shard dim
    is `dp_shard_cp` and no_shard's replicas `dp_replicate_cp`)."""
    replicate = (Replicate(),) * mesh.ndim
    # Partial("avg"): backward averages gradients over data-parallel ranks, so each rank's loss is
    # the mean over its own micro-batch, as with DDP / FSDP.
    partial = (Partial("avg"),) * mesh.ndim
    if sharding in ("full_shard", "shard_grad_op"):
        if mesh.ndim != 1:
            raise ValueError(f"{sharding} needs a 1-D mesh, got {mesh.ndim}-D")
        return Layout((Shard(0),), replicate, partial)
    if sharding == "hybrid_shard":
        if mesh.ndim != 2:
            raise ValueError("hybrid_shard needs a 2-D (dp_replicate, dp_shard) mesh")
        return Layout((Replicate(), Shard(0)), replicate, partial)
    if sharding == "no_shard":
        return Layout(replicate, replicate, partial)
    raise ValueError(f"unknown sharding {sharding!r}")


@dataclass(frozen=True, slots=True)
class TensorParallelSpec:
    """How a tensor- or expert-parallel parameter is laid out on its model-parallel mesh (what its
    gather hands back)."""

    mesh: DeviceMesh
    """The 1-D tp mesh, or the experts' ep or (ep, expert_tp) mesh."""
    placements: tuple[Placement, ...]
    """Its placements there (Shard(0), Shard(1) or Replicate per dim)."""
    local_shape: tuple[int, ...]
    """Shape of this rank's tp shard: what the data-parallel all-gather reassembles."""


def _must_recompute_gathers(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_RECOMPUTE if func in _GATHER_OPS else CheckpointPolicy.MUST_SAVE


def _reshard_context() -> tuple:
    return create_selective_checkpoint_contexts(_must_recompute_gathers)


def _not_the_in_place_notice(record: logging.LogRecord) -> bool:
    return "context_fn is passed to torch.utils.checkpoint" not in record.getMessage()


# torch logs once per process, when it compiles a checkpoint given a `context_fn`, that the region must
# hold no in-place ops. Every compiled full_shard plan compiles one: the reshard region above, a cast
# and an all-gather, which holds none; so every rank printed the notice on every clean run. The one
# notice also stands for the compiled checkpointing policies of activation_checkpoint.py, whose
# regions are the model's blocks: the built-in models have no in-place op there (a --model-factory
# model's blocks are the user's to keep so).
logging.getLogger("torch._higher_order_ops.wrap").addFilter(_not_the_in_place_notice)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherParameter:
    """Turns a stored DTensor parameter into what a module computes with: the full local tensor,
    or for a tensor-parallel parameter its tp shard as a DTensor on the tp mesh.

    Frozen (hashable): equal gathers share one module subclass (`_gathering_class`), so the blocks
    of a model keep one class per module type.
    """

    layout: Layout
    dp_mesh: DeviceMesh
    """The data-parallel mesh it is gathered over (the experts': the ranks left after ep)."""
    param_dtype: torch.dtype | None
    reduce_dtype: torch.dtype | None
    reshard_after_forward: bool
    tp: TensorParallelSpec | None = None
    """Set for parameters that tensor parallelism sharded first."""

    def _all_gather(self, param: DTensor) -> torch.Tensor:
        """Replicate `param` (a DTensor on the data-parallel mesh) and return its local tensor."""
        # forward_dtype casts the shard *before* the all-gather (half the bytes for bf16);
        # backward_dtype reduces gradients in reduce_dtype, then casts back to the master dtype.
        forward_dtype = self.param_dtype if self.param_dtype not in (None, param.dtype) else None
        backward_dtype = self.reduce_dtype if forward_dtype is not None else None
        if _REDISTRIBUTE_CASTS:
            full = param.redistribute(
                placements=self.layout.compute, forward_dtype=forward_dtype, backward_dtype=backward_dtype
            )
        else:
            # Older torch: cast the shard first; gradients are then reduced in param_dtype.
            source = param.to(forward_dtype) if forward_dtype is not None else param
            full = source.redistribute(placements=self.layout.compute)
        return full.to_local(grad_placements=self.layout.grad)

    def gather(self, param: DTensor) -> torch.Tensor:
        if self.tp is None:
            return self._all_gather(param)
        # View this rank's piece as a shard of the tp shard on the data-parallel mesh alone, gather
        # that (the backward reduce-scatters over the data-parallel dims only), and hand the module
        # the tp shard as the DTensor tensor parallelism made.
        tp = self.tp
        shape = torch.Size(tp.local_shape)
        dp_shard = DTensor.from_local(
            param.to_local(), self.dp_mesh, self.layout.param, shape=shape, stride=_contiguous_stride(shape)
        )
        return DTensor.from_local(self._all_gather(dp_shard), tp.mesh, tp.placements)

    def __call__(self, param: torch.Tensor) -> torch.Tensor:
        if not isinstance(param, DTensor):
            return param
        if self.reshard_after_forward:
            return checkpoint(self.gather, param, use_reentrant=False, context_fn=_reshard_context)
        return self.gather(param)


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= size
    return tuple(reversed(stride))


def _gathered_property(name: str, gather: GatherParameter) -> property:
    def fget(module: nn.Module) -> torch.Tensor:
        # Read the raw entry: state_dict(), named_parameters() and the optimizer see the DTensor.
        return gather(module._parameters[name])

    return property(fget)


@functools.cache
def _gathering_class(base: type, gathers: tuple[tuple[str, GatherParameter], ...]) -> type:
    # One subclass per (module class, gather per parameter name): a class-level property
    # shadows nn.Module.__getattr__, so `self.weight` in the module's forward runs the gather.
    props: dict[str, object] = {name: _gathered_property(name, gather) for name, gather in gathers}
    props["__module__"] = base.__module__
    return type(f"SimpleFSDP{base.__name__}", (base,), props)


def apply_simple_fsdp(
    model: nn.Module,
    *,
    mesh: DeviceMesh,
    sharding: str,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    reshard_after_forward: bool,
    recomputed_blocks: Iterable[nn.Module] = (),
    experts_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Shard every parameter of `model` in place and route parameter reads through a gather.

    `mesh` is the job's (dp_replicate, dp_shard, cp, tp) mesh (`distributed.build_mesh`): parameters
    are sharded over the data-parallel dims of `sharding` (`distributed.data_parallel_dims`: cp
    folded into the shard or replica dim), and tensor-parallel parameters (DTensors
    on the tp mesh) keep their tp placement on the combined mesh. `recomputed_blocks` are blocks
    under activation checkpointing: their whole forward already reruns in backward (gathers
    included), so they skip the per-parameter reshard policy. `experts_mesh`: the data-parallel mesh
    of expert-parallel experts (`expert_parallel.ExpertMeshes.data_parallel`).
    """
    dense = _DataParallel.of(data_parallel_mesh(mesh, sharding), sharding)
    # Tensor-parallel weights live on the combined (data-parallel dims..., tp) mesh.
    tp_weights = any(isinstance(p, DTensor) and not _is_expert(p) for p in model.parameters())
    if tp_weights:
        dense.combined = data_parallel_mesh(mesh, sharding, with_tp=True)
    experts = _DataParallel.of(experts_mesh, sharding) if experts_mesh is not None else None
    reshard = reshard_after_forward and sharding in ("full_shard", "hybrid_shard")
    inside_checkpoint = {id(m) for block in recomputed_blocks for m in block.modules()}
    sharded: dict[int, tuple[nn.Parameter, TensorParallelSpec | None]] = {}  # tied weights: shared
    for module in list(model.modules()):
        names = tuple(n for n, p in module._parameters.items() if p is not None)
        if not names:
            continue
        gathers = []
        for name in names:
            param = module._parameters[name]
            group = dense
            if _is_expert(param):
                assert experts is not None, "expert-parallel experts need their data-parallel mesh"
                group = experts
            if id(param) not in sharded:
                sharded[id(param)] = _shard_parameter(
                    param, dp_mesh=group.mesh, combined=group.combined_with(param), layout=group.layout
                )
            module._parameters[name], tp = sharded[id(param)]
            gather = GatherParameter(
                layout=group.layout,
                dp_mesh=group.mesh,
                param_dtype=param_dtype,
                reduce_dtype=reduce_dtype,
                reshard_after_forward=reshard and id(module) not in inside_checkpoint,
                tp=tp,
            )
            gathers.append((name, gather))
        module.__class__ = _gathering_class(type(module), tuple(gathers))
    return model


def _is_expert(param: torch.Tensor) -> bool:
    """An expert-parallel parameter: a DTensor on the experts' ep mesh (`expert_parallel`)."""
    return isinstance(param, DTensor) and "ep" in (param.device_mesh.mesh_dim_names or ())


@dataclass(slots=True)
class _DataParallel:
    """A data-parallel mesh, its layout, and the combined mesh of its model-parallel parameters."""

    mesh: DeviceMesh
    layout: Layout
    combined: DeviceMesh | None = None

    @classmethod
    def of(cls, mesh: DeviceMesh, sharding: str) -> _DataParallel:
        return cls(mesh, layout_for(sharding, mesh))

    def combined_with(self, param: torch.Tensor) -> DeviceMesh | None:
        """The (data-parallel..., model-parallel...) mesh a DTensor parameter is stored on: the
        dense engines' `with_tp` mesh, or for experts theirs with the ep (and expert_tp) dims."""
        if not _is_expert(param):
            return self.combined
        return DeviceMesh._concatenate([self.mesh, param.device_mesh])  # type: ignore[union-attr]


def _shard_parameter(
    param: torch.Tensor, *, dp_mesh: DeviceMesh, combined: DeviceMesh | None, layout: Layout
) -> tuple[nn.Parameter, TensorParallelSpec | None]:
    """The stored parameter: sharded on the data-parallel mesh, or, for a tensor-parallel DTensor,
    on the combined (dp..., tp) mesh; with the tp layout its gather must restore."""
    if not isinstance(param, DTensor):
        stored = _distribute(param, dp_mesh, layout.param)
        return nn.Parameter(stored, requires_grad=param.requires_grad), None
    tp_mesh = param.device_mesh
    if not _is_expert(param) and (tp_mesh.ndim != 1 or tp_mesh.mesh_dim_names != ("tp",)):
        raise ValueError(f"SimpleFSDP composes with 1-D tensor parallelism on the `tp` dim, got {tp_mesh}")
    tp_local = param.to_local().detach()
    # Data-parallel placements as seen on the global tensor: a dp shard of dim d taken from a tp
    # (or ep) shard of the same dim is strided (every such chunk is split again), see the module
    # docstring.
    dp_placements = tuple(_strided(p, param) for p in layout.param)
    local = _distribute(tp_local, dp_mesh, layout.param).to_local()
    assert combined is not None, "a tensor-parallel weight needs the combined (dp..., tp) mesh"
    stored = DTensor.from_local(
        local,
        combined,
        (*dp_placements, *param.placements),
        shape=param.shape,
        stride=param.stride(),
    )
    spec = TensorParallelSpec(tp_mesh, tuple(param.placements), tuple(tp_local.shape))
    return nn.Parameter(stored, requires_grad=param.requires_grad), spec


def _strided(placement: Placement, param: DTensor) -> Placement:
    """A data-parallel placement as seen on `param`'s global tensor: a Shard of a dim that `param`'s
    model-parallel placements already cut into pieces is strided (split_factor: the pieces)."""
    if not isinstance(placement, Shard):
        return placement
    pieces = math.prod(
        size for size, p in zip(param.device_mesh.shape, param.placements, strict=True)
        if isinstance(p, Shard) and p.dim == placement.dim
    )
    return _StridedShard(placement.dim, split_factor=pieces) if pieces > 1 else placement


def _distribute(param: torch.Tensor, mesh: DeviceMesh, placements: tuple[Placement, ...]) -> DTensor:
    tensor = param.detach()
    if tensor.device.type != "meta" and tensor.device.type != mesh.device_type:
        tensor = tensor.to(mesh.device_type)
    # src_data_rank=None: every rank holds the same full tensor (same seed / meta), so each keeps
    # its own chunk without any communication.
    return distribute_tensor(tensor, mesh, list(placements), src_data_rank=None)

