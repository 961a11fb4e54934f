"""Shared pieces of the models: the parts FSDP wraps, init rules, causal attention, the output head."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from executor.runtime.loss import chunked_linear_cross_entropy

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


def sdpa_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal scaled-dot-product attention; k/v may have fewer heads than q (grouped-query).
    Query i attends keys 0..i, or where `mask` says (a boolean [q_len, k_len] mask, True: attend,
    or a bias of `torch.nn.attention.bias`, e.g. context parallelism's lower-right causal one)."""
    causal: dict = {"is_causal": True} if mask is None else {"attn_mask": mask}
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, **causal)
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, **causal, enable_gqa=True)
    repeat = q.shape[1] // k.shape[1]
    k, v = (z.repeat_interleave(repeat, dim=1) for z in (k, v))
    return F.scaled_dot_product_attention(q, k, v, **causal)


class OutputHead(nn.Linear):
    """The bias-free vocabulary projection; given targets, it returns the mean cross-entropy instead
    of logits, computed in `chunks` token slices (`executor.runtime.loss`).

    The loss reads `self.weight` inside this module's own forward on purpose: eager FSDP2 unshards
    a unit's parameters only within its modules' forward hooks, and SimpleFSDP gathers on attribute
    access, so the weight must be read here, not by the caller. A plain `nn.Linear` otherwise: same
    parameter name (`weight`), so state dicts, init rules and tied embeddings are unchanged.
    """

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__(hidden, vocab, bias=False)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, targets: torch.Tensor | None = None, *, chunks: int = 1
    ) -> torch.Tensor:
        if targets is None:
            return super().forward(x)
        return chunked_linear_cross_entropy(x, self.weight, targets, chunks=chunks)


def blocks_in_order(blocks: nn.ModuleList | nn.ModuleDict) -> list[nn.Module]:
    """A model's blocks in forward order: its ModuleList, or, in a pipeline stage
    (`executor.runtime.pipeline`), the ModuleDict that keeps only the stage's blocks under their
    indices in the whole model, so that parameter names stay those of the unsplit model."""
    return list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(blocks)


def computes_own_loss(model: nn.Module) -> bool:
    """Whether `model.forward` takes `(tokens, targets, *, loss_chunks=k)` and then returns the
    scalar mean cross-entropy itself (the built-in models do). The parameter name `loss_chunks` is
    the contract: a user model without it returns logits and the caller applies the loss."""
    forward = getattr(model, "forward", None)
    return callable(forward) and "loss_chunks" in inspect.signature(forward).parameters


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
