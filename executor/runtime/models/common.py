"""Shared pieces of the models: the parts FSDP wraps, init rules, causal attention."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# `enable_gqa` arrived in torch 2.5; older torch gets key/value heads repeated explicitly.
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


@dataclass(slots=True)
class ModelParts:
    """How a model splits into FSDP wrap units and checkpointable blocks."""

    blocks: list[nn.Module]
    """Repeated transformer blocks in forward order (wrap units group `blocks_per_unit` of them)."""
    inputs: list[nn.Module] = field(default_factory=list)
    """Modules before the blocks (embeddings): one wrap unit of their own."""
    outputs: list[nn.Module] = field(default_factory=list)
    """Modules after the blocks (final norm, head): one wrap unit of their own."""


@dataclass(frozen=True, slots=True)
class InitRule:
    """How one parameter is initialised."""

    kind: Literal["normal", "ones", "zeros"]
    """Distribution."""
    std: float = 0.02
    """Standard deviation for `normal` (mean 0, truncated at 3 std)."""


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled-dot-product attention; k/v may have fewer heads than q (grouped-query)."""
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    repeat = q.shape[1] // k.shape[1]
    k, v = (z.repeat_interleave(repeat, dim=1) for z in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def find_parts(model: nn.Module) -> ModelParts:
    """The wrap units of any model: its own `parallel_parts()` or, for a user model, the longest
    `nn.ModuleList` (the repeated blocks); everything else stays with the root unit."""
    own = getattr(model, "parallel_parts", None)
    if callable(own):
        return own()
    best: nn.ModuleList | None = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and (best is None or len(module) > len(best)):
            best = module
    return ModelParts(blocks=list(best) if best is not None else [])


def replace_block(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Swap block `old` for `new` wherever a ModuleList/ModuleDict/attribute holds it."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                parent.register_module(name, new)
                return
    raise ValueError("block not found in model")
