"""Models the runtime can build: the built-in families from the plan's spec, or a user factory.

Built-in models are created on the meta device (no memory) and materialised shard by shard after
FSDP has been applied (`executor.runtime.materialize`), so an 8B or 405B model never exists unsharded.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import torch
from torch import nn

from contract.model_config import ModelConfig
from executor.runtime.models.common import InitRule, ModelParts, computes_own_loss, find_parts
from executor.runtime.models.gpt2 import GPT2
from executor.runtime.models.llama import Llama

__all__ = [
    "GPT2",
    "InitRule",
    "Llama",
    "ModelFactoryError",
    "ModelParts",
    "build_model",
    "computes_own_loss",
    "find_parts",
    "import_factory",
]

_BUILTIN = {"llama": Llama, "gpt2": GPT2}


class ModelFactoryError(ValueError):
    """A `--model-factory` that cannot be imported or does not return a module."""


def build_model(cfg: ModelConfig, *, seq_len: int, factory: str | None = None) -> nn.Module:
    """The plan's model on the meta device, or the user factory's model (wherever it puts it).

    A factory is `package.module:function`; it is called with no arguments, or with the plan's
    ModelConfig when it takes one. It must return an `nn.Module` mapping int64 tokens [batch, seq]
    to logits [batch, seq, vocab]; if its forward also takes `(tokens, targets, *, loss_chunks=k)`
    and then returns the scalar mean cross-entropy (as the built-in models do, see
    `computes_own_loss`), the trainer lets it compute the loss itself. Its blocks (for wrap units
    and activation checkpointing) are its `parallel_parts()` if it has one, otherwise its longest
    `nn.ModuleList`.
    """
    if factory:
        return _from_factory(factory, cfg)
    if cfg.architecture not in _BUILTIN:
        raise ModelFactoryError(
            f"the plan's model {cfg.name!r} is a traced `{cfg.architecture}` model: pass the code that "
            "builds it with --model-factory package.module:function"
        )
    with torch.device("meta"):
        return _BUILTIN[cfg.architecture](cfg, seq_len=seq_len)


def count_params(model: nn.Module) -> int:
    """Distinct parameters (a tied weight once), as the planner counts them."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def import_factory(
    spec: str,
    *,
    label: str = "--model-factory",
    hint: str = "put its package on PYTHONPATH on every node",
) -> Callable[..., object]:
    """The callable named by `package.module:function` (dots after the colon reach attributes).

    `label` starts every error message, so each command names its own option; `hint` says how to
    make a module importable where that command runs.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelFactoryError(f"{label} {spec!r}: write it as package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelFactoryError(
            f"{label} {spec!r}: cannot import {module_name!r} ({exc}); {hint}"
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ModelFactoryError(f"{label} {spec!r}: {module_name} has no attribute {attr!r}")
    if not callable(fn):
        raise ModelFactoryError(f"{label} {spec!r}: {attr} is not callable")
    return fn


def _from_factory(spec: str, cfg: ModelConfig) -> nn.Module:
    fn = import_factory(spec)
    takes_config = any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        for p in inspect.signature(fn).parameters.values()
    )
    model = fn(cfg) if takes_config else fn()
    if not isinstance(model, nn.Module):
        raise ModelFactoryError(f"--model-factory {spec!r} returned {type(model).__name__}, not an nn.Module")
    return model
