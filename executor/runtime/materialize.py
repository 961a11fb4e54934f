"""Materialise a meta-device model after sharding, one parameter at a time.

Each parameter's full value is drawn from a generator seeded by (seed, parameter name) on the
target device, then only this rank's shard is kept. Peak extra memory is the largest single
parameter, never the whole model, and the initial weights do not depend on the world size or the
sharding mode: a plan re-made for another cluster starts from the same model.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from executor.runtime.models import InitRule

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter name without the wrapper prefixes that AC / compile / FSDP1 insert."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def param_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed per (run seed, parameter name)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


def _fill(tensor: torch.Tensor, rule: InitRule, generator: torch.Generator) -> None:
    if rule.kind == "ones":
        tensor.fill_(1.0)
    elif rule.kind == "zeros":
        tensor.zero_()
    else:
        nn.init.trunc_normal_(tensor, std=rule.std, a=-3 * rule.std, b=3 * rule.std, generator=generator)


def _tied_entries(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Groups of (module, parameter name) that hold one parameter object (tied weights)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, name))
    return [group for group in holders.values() if len(group) > 1]


@torch.no_grad()
def materialize(model: nn.Module, *, device: torch.device, seed: int, init: bool = True) -> None:
    """Allocate `model`'s meta parameters on `device` and initialise them by the model's init rules
    (`init=False`: allocate only, for weights that are loaded next, `executor.runtime.pretrained`)."""
    init_rule = model.init_rule  # built-in models only: user factories initialise themselves
    tied = _tied_entries(model)
    model.to_empty(device=device)
    # to_empty gives every module holding a plain meta parameter a new parameter of its own, which
    # unties tied weights (the sharded engines keep theirs tied): tie them again.
    for (owner, owner_name), *others in tied:
        for module, name in others:
            module._parameters[name] = owner._parameters[owner_name]
    # A pipeline's last stage holds its own copy of a tied weight: initialised as the weight it
    # copies (executor.runtime.pipeline).
    aliases: dict[str, str] = getattr(model, "init_aliases", {})
    for name, param in model.named_parameters() if init else ():  # tied weights appear once
        key = aliases.get(clean_name(name), clean_name(name))
        rule = init_rule(key)
        # Drawn in fp32 whatever the parameter's dtype, so a pure-bf16 model starts from the mixed
        # precision one's weights, rounded.
        full = torch.empty(param.shape, dtype=torch.float32, device=device)
        generator = torch.Generator(device=device)
        generator.manual_seed(param_seed(seed, key))
        _fill(full, rule, generator)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full)
        del full
    model.reset_buffers()
