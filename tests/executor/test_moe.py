"""The llama family's mixture-of-experts blocks, latent attention and query/key norms (issue 40): routing,
the grouped matmul's fallbacks, the auxiliary loss and the bias update, shapes and causality, the
parameter count the planner prices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from contract.model_config import LatentAttention, ModelConfig, MoeConfig
from contract.plan_document import parse_plan
from executor.runtime.materialize import materialize
from executor.runtime.models import build_model, count_params
from executor.runtime.models.grouped_mm import grouped_matmul, grouped_mm_loop
from executor.runtime.models.latent_attention import LatentSelfAttention
from executor.runtime.models.layers import RotaryEmbedding
from executor.runtime.models.moe import (
    GroupedExperts,
    LocalDispatcher,
    MoEFeedForward,
    Router,
    Routing,
    load_balancing_loss,
    set_aux_loss_scale,
    update_router_bias,
)
from tests.executor.plan_factory import debug_plan

H = 8
MOE = MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=6, num_shared_experts=1)
MLA = LatentAttention(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, q_lora_rank=10)


def tiny(**fields) -> ModelConfig:
    base = dict(
        name="tiny-moe", architecture="llama", vocab_size=64, hidden_size=16, num_layers=3, num_heads=4,
        num_kv_heads=2, intermediate_size=24,
    )
    return ModelConfig(**{**base, **fields})


def router_with_logits(moe: MoeConfig, logits: list[list[float]]) -> tuple[Router, torch.Tensor]:
    """A router whose gate is the identity on one-hot-free inputs: input row = the logits wanted."""
    router = Router(moe.num_experts, moe)
    with torch.no_grad():
        router.gate.weight.copy_(torch.eye(moe.num_experts))
    return router, torch.tensor(logits)


def test_softmax_router_picks_top_k_and_renormalises() -> None:
    router, x = router_with_logits(MOE, [[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 3.0]])
    routing = router(x)
    assert routing.experts[0].tolist() == [1, 2]
    assert sorted(routing.experts[1].tolist()) == [0, 3]
    probs = x.softmax(-1)
    expected = probs[0, [1, 2]] / probs[0, [1, 2]].sum()
    torch.testing.assert_close(routing.weights[0], expected)
    torch.testing.assert_close(routing.weights.sum(-1), torch.ones(2))
    torch.testing.assert_close(routing.weights[1], torch.tensor([0.5, 0.5]))


def test_sigmoid_router_bias_chooses_but_does_not_weigh() -> None:
    moe = dataclasses.replace(MOE, router="sigmoid", router_bias=True, experts_per_token=1)
    router, x = router_with_logits(moe, [[2.0, 1.0, 0.0, 0.0]])
    assert router(x).experts.tolist() == [[0]]
    with torch.no_grad():
        router.score_bias.copy_(torch.tensor([0.0, 0.5, 0.0, 0.0]))  # sigmoid(1)+0.5 > sigmoid(2)
    routing = router(x)
    assert routing.experts.tolist() == [[1]]
    torch.testing.assert_close(routing.weights, torch.ones(1, 1))  # renormalised: one choice
    torch.testing.assert_close(routing.scores, x.sigmoid())  # the bias is not in the scores
    router.eval()
    two = dataclasses.replace(moe, experts_per_token=2)
    router2, x2 = router_with_logits(two, [[2.0, 1.0, 0.0, -1.0]])
    w = router2(x2).weights
    s = x2.sigmoid()[0, :2]
    torch.testing.assert_close(w[0], s / s.sum())


def test_load_balancing_loss_on_a_hand_made_case() -> None:
    scores = torch.tensor([[0.8, 0.2], [0.6, 0.4]])
    # Both tokens on expert 0: f = [1, 0], P = [0.7, 0.3]: 2 * 0.7.
    skewed = Routing(experts=torch.tensor([[0], [0]]), weights=torch.ones(2, 1), scores=scores)
    assert load_balancing_loss(skewed, 2).item() == pytest.approx(1.4)
    # Uniform load and probabilities: 1.
    uniform = Routing(
        experts=torch.tensor([[0], [1]]), weights=torch.ones(2, 1), scores=torch.full((2, 2), 0.5)
    )
    assert load_balancing_loss(uniform, 2).item() == pytest.approx(1.0)


def per_expert_reference(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    out, start = [], 0
    for e, n in enumerate(counts):
        for row in range(start, start + n):
            out.append(x[row] @ w[e])
        start += n
    return torch.stack(out)


@pytest.mark.parametrize("counts", [[3, 0, 2, 5], [0, 0, 10, 0], [1, 1, 1, 7]])
def test_grouped_matmul_fallback_equals_a_per_expert_loop(counts: list[int]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 6, generator=g, requires_grad=True)
    w = torch.randn(4, 6, 5, generator=g, requires_grad=True)
    tensor = torch.tensor(counts)
    out = grouped_matmul(x, w, tensor)
    expected = per_expert_reference(x, w, counts)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(10, 5, generator=g)
    got = torch.autograd.grad(out, (x, w), upstream)
    want = torch.autograd.grad(expected, (x, w), upstream)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    torch.library.opcheck(grouped_mm_loop, (x, w, tensor))


def naive_moe(ffn: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the routed experts' SwiGLU outputs, weighted, plus the shared experts."""
    routing = ffn.router(x)
    ex = ffn.experts
    rows = []
    for t in range(x.shape[0]):
        y = ffn.shared(x[t]) if ffn.shared is not None else torch.zeros_like(x[t])
        for e, weight in zip(routing.experts[t].tolist(), routing.weights[t], strict=True):
            gate, up = x[t] @ ex.w1[e], x[t] @ ex.w3[e]
            if ex.bias:
                gate, up = gate + ex.b1[e], up + ex.b3[e]
            out = (torch.nn.functional.silu(gate) * up) @ ex.w2[e]
            y = y + weight * (out + ex.b2[e] if ex.bias else out)
        rows.append(y)
    return torch.stack(rows)


def random_init(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.mark.parametrize("expert_bias", [False, True])
def test_moe_feed_forward_equals_a_token_by_token_loop(expert_bias: bool) -> None:
    ffn = MoEFeedForward(H, dataclasses.replace(MOE, expert_bias=expert_bias)).eval()
    random_init(ffn)
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ffn(x), naive_moe(ffn, x.reshape(-1, H)).view(2, 5, H))


def test_dispatch_and_combine_are_inverse() -> None:
    x = torch.randn(5, H)
    experts = torch.tensor([[2, 0], [1, 2], [0, 3], [3, 1], [2, 1]])
    dispatcher = LocalDispatcher()
    d = dispatcher.dispatch(x, experts, 4)
    assert d.tokens_per_expert.tolist() == [2, 3, 3, 2]
    torch.testing.assert_close(dispatcher.combine(d.rows, d, torch.full((5, 2), 0.5)), x)


def test_aux_loss_joins_the_gradient_scaled() -> None:
    ffn = MoEFeedForward(H, MOE, aux_loss_coef=0.1).train()
    random_init(ffn)
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(2))
    ffn(x).sum().backward()
    with_aux = ffn.router.gate.weight.grad.clone()
    ffn.zero_grad()
    ffn.eval()  # no auxiliary gradient: add the loss by hand
    routing = ffn.router(x)
    (ffn(x).sum() + 0.1 * load_balancing_loss(routing, MOE.num_experts)).backward()
    torch.testing.assert_close(with_aux, ffn.router.gate.weight.grad)
    ffn.zero_grad()
    ffn.train()
    set_aux_loss_scale(ffn, 0.5)
    ffn(x).sum().backward()
    half = ffn.router.gate.weight.grad.clone()
    ffn.zero_grad()
    ffn.eval()
    (ffn(x).sum() + 0.05 * load_balancing_loss(ffn.router(x), MOE.num_experts)).backward()
    torch.testing.assert_close(half, ffn.router.gate.weight.grad)
    biased = MoEFeedForward(H, dataclasses.replace(MOE, router="sigmoid", router_bias=True))
    assert biased.aux_loss_coef == 0.0  # balanced by its bias instead


def test_router_bias_update_moves_towards_underloaded_experts() -> None:
    moe = dataclasses.replace(MOE, router="sigmoid", router_bias=True)
    ffn = MoEFeedForward(H, moe).train()
    random_init(ffn)
    ffn.router.reset_buffers()
    x = torch.randn(16, H, generator=torch.Generator().manual_seed(3))
    ffn(x)
    load = ffn.router.tokens_per_expert.clone()
    assert load.sum().item() == 16 * moe.experts_per_token
    update_router_bias(ffn, rate=0.01)
    expected = 0.01 * torch.sign(load.float().mean() - load.float())
    torch.testing.assert_close(ffn.router.score_bias, expected)
    assert ffn.router.tokens_per_expert.sum().item() == 0  # counts restart every step


def test_moe_feed_forward_compiles_without_graph_breaks() -> None:
    ffn = MoEFeedForward(H, dataclasses.replace(MOE, expert_bias=True)).train()
    random_init(ffn)
    x = torch.randn(2, 6, H, generator=torch.Generator().manual_seed(4), requires_grad=True)
    eager = ffn(x)
    eager.sum().backward()
    grads = {n: p.grad.clone() for n, p in ffn.named_parameters()}
    ffn.zero_grad()
    compiled = torch.compile(ffn, fullgraph=True, backend="aot_eager")(x)
    compiled.sum().backward()
    torch.testing.assert_close(compiled, eager)
    for name, p in ffn.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], msg=name)


def test_latent_attention_shapes_and_causality() -> None:
    cfg = tiny(latent_attention=MLA)
    attention = LatentSelfAttention(cfg)
    random_init(attention)
    rope = RotaryEmbedding(MLA.qk_rope_head_dim, max_len=8, theta=10000.0)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))
    out = attention(x, rope)
    assert out.shape == (2, 8, 16)
    assert attention.wq_b.out_features == 4 * MLA.qk_head_dim
    assert attention.wkv_b.out_features == 4 * (MLA.qk_nope_head_dim + MLA.v_head_dim)
    assert attention.wo.in_features == 4 * MLA.v_head_dim
    later = x.clone()
    later[:, 5:] = torch.randn(2, 3, 16)
    torch.testing.assert_close(attention(later, rope)[:, :5], out[:, :5])  # causal
    assert not torch.allclose(attention(later, rope)[:, 5:], out[:, 5:])
    direct = LatentSelfAttention(tiny(latent_attention=dataclasses.replace(MLA, q_lora_rank=None)))
    assert direct.wq.out_features == 4 * MLA.qk_head_dim and not hasattr(direct, "wq_a")


def expected_params(cfg: ModelConfig) -> int:
    """The count written out: embeddings, head, final norm, and per block its two norms, attention
    and dense or MoE feed-forward (router, experts, shared experts, biases)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    total = 2 * v * h + h
    for i in range(cfg.num_layers):
        total += 2 * h
        if cfg.latent_attention is not None:
            m, heads = cfg.latent_attention, cfg.num_heads
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
            total += q + kv + heads * m.v_head_dim * h
        else:
            a, kv = cfg.attention_width, cfg.kv_heads * cfg.head_dim
            total += 2 * h * a + 2 * h * kv + (2 * cfg.head_dim if cfg.qk_norm else 0)
        moe = cfg.moe
        if moe is not None and moe.is_moe_layer(i):
            e, fe = moe.num_experts, moe.expert_intermediate_size
            total += h * e + e * 3 * h * fe + 3 * h * moe.num_shared_experts * moe.shared_size
            if moe.expert_bias:
                total += e + e * (2 * fe + h)
        else:
            total += 3 * h * cfg.ffn_size
    return total


MODELS = {
    "moe": tiny(moe=dataclasses.replace(MOE, first_dense_layers=1)),
    "moe-interleaved-biased": tiny(
        num_layers=4, moe=dataclasses.replace(MOE, layer_interval=2, expert_bias=True, num_shared_experts=0)
    ),
    "deepseek-like": tiny(
        latent_attention=MLA,
        moe=dataclasses.replace(MOE, router="sigmoid", router_bias=True, num_shared_experts=2,
                                shared_expert_intermediate_size=5, first_dense_layers=1),
    ),
    "qk-norm": tiny(qk_norm=True),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_is_the_planners(name: str) -> None:
    from planner.cost.model_costs import count_parameters
    from planner.specs import ModelSpec

    cfg = MODELS[name]
    document = parse_plan(debug_plan(model=_model_document(cfg))).model  # the runtime reads it whole
    assert document.moe == cfg.moe and document.latent_attention == cfg.latent_attention
    counted = count_params(build_model(document, seq_len=16))
    assert counted == expected_params(cfg)
    assert counted == count_parameters(ModelSpec.model_validate(_model_document(cfg)))


def _model_document(cfg: ModelConfig) -> dict:
    document = dataclasses.asdict(cfg)
    for derived in ("num_params", "flops_per_token"):
        document.pop(derived)
    return document


def test_built_models_train_a_step_eagerly() -> None:
    cfg = MODELS["deepseek-like"]
    model = build_model(cfg, seq_len=16)
    materialize(model, device=torch.device("cpu"), seed=7)
    assert model.layers[1].feed_forward.router.score_bias.abs().sum() == 0  # reset_buffers zeroed it
    tokens = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    assert type(model.layers[0].feed_forward).__name__ == "FeedForward"  # first_dense_layers


def test_grouped_experts_layout() -> None:
    experts = GroupedExperts(H, 6, num_experts=4, bias=False)
    assert experts.w1.shape == (4, H, 6) and experts.w2.shape == (4, 6, H)


@pytest.mark.parametrize(
    "name", ["qwen3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b", "llama4-maverick"]
)
def test_catalog_moe_models_build_with_the_planners_count(name: str) -> None:
    from planner.catalog.models import catalog_model
    from planner.cost.model_costs import count_parameters

    spec = catalog_model(name)
    runtime = parse_plan(debug_plan(model=spec.model_dump(mode="json"))).model
    model = build_model(runtime, seq_len=64)  # meta device: no memory even for 671B
    assert count_params(model) == count_parameters(spec)
