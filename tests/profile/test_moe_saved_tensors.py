"""What the runtime's MoE feed-forward keeps for backward, per token, against the planner's count
(planner/cost/block_parts.py `moe_feed_forward`), eager and compiled, for routers and experts of
several shapes: the router's fp32 scores, top-k indices and weights, the rows gathered for the
experts, the grouped GEMMs' inputs, the SwiGLU intermediates, the outputs back in token order and
the indices that carry them. Two token counts are traced and only what grows with the tokens is
compared (the weights and the per-expert counts do not), so the comparison is exact.

Eager, the block's norm keeps its input and normalized value outside this module (the planner's
`saved_elems` counts them with the norm's output, which the router and the shared experts read):
the module keeps `saved_elems - 2 * hidden`. Compiled, the planner counts the norm's output only:
the module keeps `compiled_saved_elems`."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from contract.model_config import MoeConfig
from executor.runtime.models.moe import MoEFeedForward
from planner.cost.block_parts import moe_feed_forward
from tests.profile.test_compiled_saved import saved_outputs

HIDDEN = 256
ROUTED = MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=128)
CASES = {
    "softmax-top2": ROUTED,
    "shared-expert": replace(ROUTED, num_shared_experts=1, shared_expert_intermediate_size=192),
    "expert-biases": replace(ROUTED, expert_bias=True),
    "sigmoid-bias-top4": replace(ROUTED, experts_per_token=4, router="sigmoid", router_bias=True),
    "top1-of-16": replace(ROUTED, num_experts=16, experts_per_token=1),
}
TOKENS = (192, 384)


def _block(moe: MoeConfig) -> MoEFeedForward:
    torch.manual_seed(0)
    block = MoEFeedForward(HIDDEN, moe)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return block.to(torch.bfloat16).train()


def _eager_bytes(block: MoEFeedForward, tokens: int) -> int:
    """Bytes of every storage autograd keeps in one forward, weights and buffers excluded."""
    weights = {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    held: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key not in weights:
            held.setdefault(key, tensor)  # alive until the end: no address is reused
        return tensor

    x = torch.randn(1, tokens, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(t.untyped_storage().nbytes() for t in held.values())


def _compiled_bytes(block: MoEFeedForward, tokens: int) -> int:
    """Bytes of what inductor's partitioner saves for backward (static shapes: compiled afresh)."""
    torch._dynamo.reset()
    x = torch.randn(1, tokens, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    with saved_outputs() as saved:
        torch.compile(block, fullgraph=True, dynamic=False)(x)
    assert saved, "the compiled block saved nothing: the partitioner was not reached"
    sized = [t for t in saved if isinstance(t, torch.Tensor) and all(isinstance(d, int) for d in t.shape)]
    return sum(t.numel() * t.element_size() for t in sized)


def _per_token(measure, block: MoEFeedForward) -> float:
    """16-bit elements per token of what grows with the tokens."""
    few, many = (measure(block, t) for t in TOKENS)
    return (many - few) / (TOKENS[1] - TOKENS[0]) / 2


@pytest.mark.parametrize("case", list(CASES))
def test_eager_moe_keeps_what_the_planner_counts(case: str) -> None:
    moe = CASES[case]
    measured = _per_token(_eager_bytes, _block(moe))
    planned = moe_feed_forward(h=HIDDEN, moe=moe).part.saved_elems - 2 * HIDDEN
    assert measured == pytest.approx(planned, abs=1e-6)


@pytest.mark.parametrize("case", ["softmax-top2", "expert-biases"])
def test_compiled_moe_keeps_what_the_planner_counts(case: str) -> None:
    moe = CASES[case]
    measured = _per_token(_compiled_bytes, _block(moe))
    assert measured == pytest.approx(moe_feed_forward(h=HIDDEN, moe=moe).part.compiled_saved_elems, abs=1e-6)
