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
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

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
    """Placements for `sharding` on `mesh` (1-D, or 2-D replicate x shard for hybrid_shard)."""
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
            raise ValueError("hybrid_shard needs a 2-D (replicate, shard) mesh")
        return Layout((Replicate(), Shard(0)), replicate, partial)
    if sharding == "no_shard":
        return Layout(replicate, replicate, partial)
    raise ValueError(f"unknown sharding {sharding!r}")


def _must_recompute_gathers(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_RECOMPUTE if func in _GATHER_OPS else CheckpointPolicy.MUST_SAVE


def _reshard_context() -> tuple:
    return create_selective_checkpoint_contexts(_must_recompute_gathers)


class GatherParameter:
    """Turns a stored DTensor parameter into the full local tensor a module computes with."""

    def __init__(
        self,
        layout: Layout,
        *,
        param_dtype: torch.dtype | None,
        reduce_dtype: torch.dtype | None,
        reshard_after_forward: bool,
    ) -> None:
        self.layout = layout
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype
        self.reshard_after_forward = reshard_after_forward

    def gather(self, param: DTensor) -> torch.Tensor:
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

    def __call__(self, param: torch.Tensor) -> torch.Tensor:
        if not isinstance(param, DTensor) or not _gathering_enabled():
            return param
        if self.reshard_after_forward:
            return checkpoint(self.gather, param, use_reentrant=False, context_fn=_reshard_context)
        return self.gather(param)


_GATHER_STATE = {"enabled": True}


def _gathering_enabled() -> bool:
    return _GATHER_STATE["enabled"]


@contextlib.contextmanager
def gathering_disabled() -> Iterator[None]:
    """Within this block, module parameter attributes return the stored DTensors themselves."""
    previous = _GATHER_STATE["enabled"]
    _GATHER_STATE["enabled"] = False
    try:
        yield
    finally:
        _GATHER_STATE["enabled"] = previous


def _gathered_property(name: str, gather: GatherParameter) -> property:
    def fget(module: nn.Module) -> torch.Tensor:
        # Read the raw entry: state_dict(), named_parameters() and the optimizer see the DTensor.
        return gather(module._parameters[name])

    return property(fget)


@functools.cache
def _gathering_class(base: type, names: tuple[str, ...], gather: GatherParameter) -> type:
    # One subclass per (module class, parameter names, gather policy): a class-level property
    # shadows nn.Module.__getattr__, so `self.weight` in the module's forward runs the gather.
    props: dict[str, object] = {name: _gathered_property(name, gather) for name in names}
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
) -> nn.Module:
    """Shard every parameter of `model` in place and route parameter reads through a gather.

    `recomputed_blocks` are blocks under activation checkpointing: their whole forward already
    reruns in backward (gathers included), so they skip the per-parameter reshard policy.
    """
    if sharding == "no_shard" and mesh.ndim == 2:
        # The shard dimension has size 1: keep to the replicas so gradients take one all-reduce.
        mesh = mesh["replicate"]
    layout = layout_for(sharding, mesh)
    reshard = reshard_after_forward and sharding in ("full_shard", "hybrid_shard")
    gathers = {
        flag: GatherParameter(
            layout, param_dtype=param_dtype, reduce_dtype=reduce_dtype, reshard_after_forward=flag
        )
        for flag in (False, True)
    }
    inside_checkpoint = {id(m) for block in recomputed_blocks for m in block.modules()}
    sharded: dict[int, nn.Parameter] = {}  # tied weights: one DTensor parameter, shared
    for module in list(model.modules()):
        names = tuple(n for n, p in module._parameters.items() if p is not None)
        if not names:
            continue
        for name in names:
            param = module._parameters[name]
            if id(param) not in sharded:
                sharded[id(param)] = nn.Parameter(
                    _distribute(param, mesh, layout.param), requires_grad=param.requires_grad
                )
            module._parameters[name] = sharded[id(param)]
        gather = gathers[reshard and id(module) not in inside_checkpoint]
        module.__class__ = _gathering_class(type(module), names, gather)
    return model


def _distribute(param: torch.Tensor, mesh: DeviceMesh, placements: tuple[Placement, ...]) -> DTensor:
    tensor = param.detach()
    if tensor.device.type != "meta" and tensor.device.type != mesh.device_type:
        tensor = tensor.to(mesh.device_type)
    # src_data_rank=None: every rank holds the same full tensor (same seed / meta), so each keeps
    # its own chunk without any communication.
    return distribute_tensor(tensor, mesh, list(placements), src_data_rank=None)


def is_simple_fsdp(model: nn.Module) -> bool:
    """Whether apply_simple_fsdp was applied to some module of `model`."""
    return any(type(m).__name__.startswith("SimpleFSDP") for m in model.modules())
