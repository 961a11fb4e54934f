"""What the runtime's MoE feed-forward keeps for backward, per token, against the planner's count
(planner/cost/block_parts.py `moe_feed_forward`), eager and compiled, for routers and experts of
several shapes: the router's fp32 scores, top-k indices and weights, the rows gathered for the
experts, the grouped GEMMs' inputs, the SwiGLU intermediates, the outputs back in token order and
the indices that carry them. Two token counts are traced and only what grows with the tokens is
compared (the weights and the per-expert counts do not), so the comparison is exact.

Eager, the block's norm keeps its input and normalized value outside this module (the planner's
`saved_elems` counts them with the norm's output, which the router and the shared experts read):
the module keeps `saved_elems - 2 * hidden`. Compiled, the planner counts the norm's output only:
the module keeps `compiled_saved_elems`.

Under op-level selective checkpointing (executor/runtime/activation_checkpoint.py `_op_sac_context`)
the module keeps what the policy saves (the router's top-k, every other matmul output; with expert
parallelism the all-to-alls' outputs), counted from the policy's own storage against
`op_saved_elems` (plus `exchange_elems` with an expert-parallel group, here a single-process one);
its recompute must not run the all-to-all again."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from contract.model_config import MoeConfig
from executor.runtime.activation_checkpoint import _op_sac_context
from executor.runtime.expert_parallel import AllToAllDispatcher
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


@pytest.fixture(scope="module")
def ep_group() -> Iterator[dist.ProcessGroup]:
    """A single-process gloo group: the expert-parallel dispatcher's all-to-alls run over it (ep 1)."""
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if started:
        dist.destroy_process_group()


def _op_sac_bytes(block: MoEFeedForward, tokens: int) -> int:
    """Bytes the op-level SAC policy keeps for backward in one checkpointed forward: its storage (the
    outputs it must save). Nothing else leaves the checkpoint but its input (the norm output)."""
    contexts: list = []
    factory = _op_sac_context(keep_gathered_params=False)

    def context_fn():
        forward, recompute = factory()
        contexts.append(forward)
        return forward, recompute

    x = torch.randn(1, tokens, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    outside: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: outside.append(t) or t, lambda t: t):
        checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    assert [t.untyped_storage().data_ptr() for t in outside] == [x.untyped_storage().data_ptr()]
    (forward,) = contexts
    kept = {}
    for calls in forward.storage.values():  # per op: each call's outputs, or a mark to recompute it
        for output in calls.values() if isinstance(calls, dict) else calls:
            for wrapped in tree_leaves(output):
                value = getattr(wrapped, "val", None)  # kept tensors come wrapped with their version
                if isinstance(value, torch.Tensor):
                    kept.setdefault(value.untyped_storage().data_ptr(), value)
    return sum(t.untyped_storage().nbytes() for t in kept.values())


@pytest.mark.parametrize("case", list(CASES))
def test_op_sac_moe_keeps_what_the_planner_counts(case: str) -> None:
    """The block's first matmul is the router's, as after grouped-query attention's four."""
    moe = CASES[case]
    measured = _per_token(_op_sac_bytes, _block(moe))
    planned = moe_feed_forward(h=HIDDEN, moe=moe, matmuls_before=4).part
    assert measured == pytest.approx(planned.op_saved_elems, abs=1e-6)
    assert planned.op_routing_elems == 6 * moe.experts_per_token + moe.num_experts


@pytest.mark.parametrize("case", ["softmax-top2", "shared-expert", "expert-biases"])
def test_op_sac_expert_parallel_moe_keeps_the_all_to_alls(case: str, ep_group: dist.ProcessGroup) -> None:
    moe = CASES[case]
    block = _block(moe)
    block.dispatcher = AllToAllDispatcher(group=ep_group, ep=1)
    measured = _per_token(_op_sac_bytes, block)
    planned = moe_feed_forward(h=HIDDEN, moe=moe).part
    assert measured == pytest.approx(planned.op_saved_elems + planned.exchange_elems, abs=1e-6)


@pytest.mark.parametrize("case", ["softmax-top2", "sigmoid-bias-top4"])
def test_op_sac_recompute_does_not_exchange_rows_again(
    case: str, ep_group: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward exchanges rows twice (dispatch, combine) and backward twice (their transposes); the
    recompute reuses the saved outputs and the same routing, so the gradients are the plain block's."""
    block = _block(CASES[case])
    block.dispatcher = AllToAllDispatcher(group=ep_group, ep=1)
    calls: list[tuple] = []
    all_to_all = dist.all_to_all_single

    def counted(*args, **kwargs):
        calls.append(args[2:4])  # the split sizes
        return all_to_all(*args, **kwargs)

    monkeypatch.setattr(dist, "all_to_all_single", counted)
    x = torch.randn(1, 96, HIDDEN, dtype=torch.bfloat16)

    def gradients(run) -> list[torch.Tensor]:
        block.zero_grad()
        inp = x.clone().requires_grad_()
        run(inp).float().square().sum().backward()
        return [inp.grad, *(p.grad for p in block.parameters())]

    plain = gradients(block)
    assert len(calls) == 4
    calls.clear()
    sac = _op_sac_context(keep_gathered_params=False)
    checkpointed = gradients(lambda inp: checkpoint(block, inp, use_reentrant=False, context_fn=sac))
    assert len(calls) == 4, "the op-level SAC recompute ran the expert-parallel all-to-all again"
    for a, b in zip(plain, checkpointed, strict=True):
        torch.testing.assert_close(a, b)
