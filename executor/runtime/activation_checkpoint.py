"""Activation checkpointing per the plan: none, every k-th block, op-level selective, or full.

Blocks are wrapped with torch's `checkpoint_wrapper` (non-reentrant). The wrapper only adds
`_checkpoint_wrapped_module` to parameter names; distributed checkpoints are saved through
`get_state_dict`, which strips it, so checkpoints move freely between AC settings.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from executor.runtime import expert_parallel  # noqa: F401  (registers fsdp_planner::exchange_rows)
from executor.runtime.models import ModelParts
from executor.runtime.models.common import replace_block


def _op(namespace: str, name: str, overload: str = "default") -> object | None:
    packet = getattr(getattr(torch.ops, namespace), name, None)
    return getattr(packet, overload, None) if packet is not None else None


# Outputs worth keeping under op-level SAC: attention (expensive to recompute, small to keep) and
# reduce-scatters (never re-run communication); matmuls alternate save / recompute.
_SAVE_OPS = {
    op
    for op in (
        _op("aten", "_scaled_dot_product_flash_attention"),
        _op("aten", "_scaled_dot_product_efficient_attention"),
        _op("aten", "_scaled_dot_product_cudnn_attention"),
        _op("aten", "_scaled_dot_product_flash_attention_for_cpu"),
        _op("_c10d_functional", "reduce_scatter_tensor"),
    )
    if op is not None
}
# Op-level SAC keeps also what a mixture of experts must not redo (torchtitan's policy keeps the
# same): the router's top-k, so that the recompute cannot send a token to other experts than forward
# did (the scores are recomputed, and equal only up to kernel nondeterminism), and expert
# parallelism's all-to-alls (the per-expert counts over the functional collective, the rows over
# `exchange_rows`), so that backward never re-runs communication. The routed experts' grouped GEMMs
# (`_grouped_mm`, or the loop operator off sm90) stay recomputed, as torchtitan leaves them: keeping
# the first would hold k x expert width per token, what op-level SAC on MoE blocks saves by
# recomputing; the planner prices their recompute (planner/cost/block_parts.py `moe_feed_forward`).
_EXPERT_SAVE_OPS = {
    op
    for op in (
        torch.ops.aten.topk.default,
        _op("_c10d_functional", "all_to_all_single"),
        torch.ops.fsdp_planner.exchange_rows.default,
    )
    if op is not None
}
MUST_SAVE, PREFER_RECOMPUTE = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
# FP8 GEMMs (Float8 plans on FP8 GPUs; torchao's CPU emulation runs mm) count as matmuls too.
_MATMULS = {
    op
    for op in (
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        _op("aten", "_scaled_mm"),
        _op("aten", "_scaled_mm_v2"),
    )
    if op is not None
}
_GATHERS = {
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.wait_tensor.default,
}


def _op_sac_context(*, keep_gathered_params: bool):
    """Context functions for op-level SAC: save attention, every other matmul output, and a mixture
    of experts' routing and all-to-alls (`_EXPERT_SAVE_OPS`)."""

    def policy_factory():
        mm_count: dict[str, int] = defaultdict(int)

        def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
            if func in _GATHERS:
                # shard_grad_op keeps gathered parameters through backward; sharded plans re-gather.
                return MUST_SAVE if keep_gathered_params else PREFER_RECOMPUTE
            if func in _SAVE_OPS or func in _EXPERT_SAVE_OPS:
                return MUST_SAVE
            if func in _MATMULS:
                # Count forward and recompute separately so both passes pick the same matmuls.
                key = "recompute" if ctx.is_recompute else "forward"
                mm_count[key] += 1
                return MUST_SAVE if mm_count[key] % 2 == 1 else PREFER_RECOMPUTE
            return PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return policy_factory


def _recompute_all_context(*, keep_gathered_params: bool):
    """Whole-block recomputation as an SAC policy (see apply_activation_checkpointing): every op is
    recomputed except attention (whose output and softmax statistics are kept, as torchtitan does)
    and the FSDP and tensor-parallel collectives. A mixture of experts' token exchange runs again
    with its router (keeping its outputs would hold k rows per token, what whole-block checkpointing
    is chosen to free; the planner prices the second exchange)."""

    def policy_factory():
        def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
            if keep_gathered_params and func in _GATHERS:
                return MUST_SAVE
            if func in _SAVE_OPS:
                return MUST_SAVE
            return PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return policy_factory


def checkpointed_indices(mode: str, every_k: int, num_blocks: int, *, blocks: int = 0) -> list[int]:
    """Blocks (0-based) whose activations are recomputed; `selective` takes blocks k, 2k, ... (1-based),
    `blocks` the first `blocks` of them (Megatron-LM's `--recompute-method block`: backward frees the
    later blocks' activations before it recomputes the first), as the planner's cost model does."""
    if mode in ("full", "op_selective"):
        return list(range(num_blocks))
    if mode == "selective":
        return [i for i in range(num_blocks) if (i + 1) % every_k == 0]
    if mode == "blocks":
        return list(range(min(blocks, num_blocks)))
    if mode == "none":
        return []
    raise ValueError(f"unknown activation checkpointing mode {mode!r}")


def apply_activation_checkpointing(
    model: nn.Module,
    parts: ModelParts,
    *,
    mode: str,
    every_k: int,
    keep_gathered_params: bool,
    compiled: bool = False,
    blocks: int = 0,
) -> list[nn.Module]:
    """Wrap the chosen blocks in place; returns the wrapped blocks and updates `parts.blocks`.

    Under torch.compile with DTensor parameters (SimpleFSDP), torch 2.13 fails at run time when a
    checkpointed block recomputes attention ("expected all tensors_saved_with_vc_check to be
    Tensors, got ... DeviceMesh"), with plain checkpointing as with an all-recompute policy. So
    compiled whole-block checkpointing is an SAC policy that recomputes every op but attention and
    collectives: the attention output of a block (batch x seq x hidden) stays saved.
    """
    wrapped: list[nn.Module] = []
    for index in checkpointed_indices(mode, every_k, len(parts.blocks), blocks=blocks):
        block = parts.blocks[index]
        kwargs: dict = {"preserve_rng_state": False}
        if mode == "op_selective":
            kwargs["context_fn"] = _op_sac_context(keep_gathered_params=keep_gathered_params)
        elif compiled:
            kwargs["context_fn"] = _recompute_all_context(keep_gathered_params=keep_gathered_params)
        new = checkpoint_wrapper(block, **kwargs)
        replace_block(model, block, new)
        parts.blocks[index] = new
        wrapped.append(new)
    return wrapped
