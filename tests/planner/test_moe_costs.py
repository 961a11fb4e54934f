"""Mixture-of-experts blocks, latent attention and query/key norms as the cost model prices them."""

from __future__ import annotations

import dataclasses

import pytest

from contract.model_config import LatentAttention, MoeConfig
from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import catalog_model
from planner.cost.block_parts import latent_attention, moe_feed_forward
from planner.cost.gemm import _gemm_shapes, curve_seconds, expert_rows, matmul_seconds, rank_imbalance
from planner.cost.model_costs import expert_parallel_share, model_costs, tensor_parallel_share
from planner.cost.parameters import CostParameters, default_parameters
from planner.specs import ClusterSpec, ModelSpec


def _small(**changes: object) -> ModelSpec:
    dims: dict[str, object] = dict(
        name="tiny-moe", architecture="llama", vocab_size=1000, hidden_size=256, num_layers=4, num_heads=8,
        num_kv_heads=4, intermediate_size=512,
    )
    return ModelSpec(**(dims | changes))


MOE = MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=128, num_shared_experts=1,
                first_dense_layers=1)


def test_moe_block_counts_every_expert_and_runs_top_k() -> None:
    h, f, fe = 256, 512, 128
    costs = model_costs(_small(moe=MOE), 1024)
    dense, routed = costs.blocks[0], costs.blocks[1]
    # One object per kind: the cost model prices runs of the same object once.
    assert costs.blocks[1] is costs.blocks[3] and dense is not routed
    assert routed.num_params - dense.num_params == (h * 8 + 8 * 3 * h * fe + 3 * h * fe) - 3 * h * f
    assert routed.expert_params == 8 * 3 * h * fe
    assert routed.inactive_params == 6 * 3 * h * fe
    assert routed.expert_matmul_params == 2 * 3 * h * fe
    assert routed.matmul_params == dense.matmul_params - 3 * h * f + h * 8 + 3 * 3 * h * fe
    assert costs.active_params == costs.num_params - 3 * routed.inactive_params
    assert costs.flops_params == costs.active_params - costs.num_params_embedding


def test_grouped_gemms_price_few_rows_per_expert_slower() -> None:
    p = dataclasses.replace(catalog_params(), expert_load_imbalance=1.0)
    costs = model_costs(catalog_model("qwen3-30b-a3b"), 4096)
    block = costs.blocks[0]
    tokens = 4096
    rows = expert_rows(tokens, experts=128, experts_per_token=8, imbalance=1.0)
    assert rows == 256
    moe = matmul_seconds(p, block, tokens, dtype_bytes=2)
    # The same FLOPs run at the micro-batch's rows (as if one dense SwiGLU k experts wide) is faster.
    dense_shapes = _gemm_shapes(block.linear_shapes, 1, block.gemms, 0)
    wide = sum(
        curve_seconds(tokens, n, k, rate=p.peak_flops * p.matmul_efficiency, bandwidth=p.gemm_bandwidth,
                      sms=p.sm_count, overhead=p.matmul_overhead_s, dtype_bytes=2)
        for n, k in (*dense_shapes, (8 * 768, 2048), (8 * 768, 2048), (2048, 8 * 768))
    )
    assert moe > wide
    # Imbalance: every expert priced at the most-loaded rank's mean expert's rows.
    skewed = dataclasses.replace(p, expert_load_imbalance=1.5)
    assert matmul_seconds(skewed, block, tokens, dtype_bytes=2) > moe


def test_a_rank_holding_many_experts_averages_their_loads() -> None:
    """The pace is the busiest rank's rows, the sum of its experts' loads: one expert per rank carries a
    single expert's imbalance, a rank of n experts about 1 / sqrt(n) of it."""
    assert rank_imbalance(1.2, 1) == pytest.approx(1.2)
    assert rank_imbalance(1.2, 4) == pytest.approx(1.1)
    assert rank_imbalance(1.2, 128) == pytest.approx(1.0 + 0.2 / 128**0.5)
    assert rank_imbalance(1.0, 7) == 1.0
    assert expert_rows(4096, experts=2, experts_per_token=8, imbalance=1.2) > 4096 * 8 / 2 * 1.14
    assert expert_rows(4096, experts=128, experts_per_token=8, imbalance=1.2) == 261  # 256 x 1.018, up


def catalog_params() -> CostParameters:
    return default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")


def test_tensor_parallel_splits_experts_like_a_dense_mlp() -> None:
    costs = model_costs(_small(moe=MOE), 1024)
    share = tensor_parallel_share(costs, 2)
    routed, whole = share.blocks[1], costs.blocks[1]
    assert routed.expert_matmul_params == whole.expert_matmul_params // 2
    assert routed.expert_params == whole.expert_params // 2
    assert routed.linear_share == 2 and routed.expert_shapes == whole.expert_shapes
    # The dispatch buffers stay whole on every rank (the experts read the gathered sequence).
    assert routed.dispatch_elems == whole.dispatch_elems
    rest = whole.saved_elems - whole.gathered_elems - whole.dispatch_elems
    assert routed.saved_elems == rest / 2 + whole.gathered_elems + whole.dispatch_elems


def test_op_level_checkpointing_of_moe_blocks_follows_the_matmul_alternation() -> None:
    """The runtime's op-level policy keeps every other matmul output of a block (the 1st, 3rd, ...),
    the router's top-k, and with expert parallelism both all-to-alls' outputs; it recomputes every
    grouped expert GEMM (tests/profile/test_moe_saved_tensors.py counts what it keeps)."""
    h, fe, shared, k, e = 256, 128, 128, 2, 8
    after_four = moe_feed_forward(h=h, moe=MOE, matmuls_before=4).part  # grouped-query attention
    after_five = moe_feed_forward(h=h, moe=MOE, matmuls_before=5).part  # latent attention with q_lora
    # After four: the router (5th) and the shared experts' w3 (7th) kept, w1 and w2 recomputed.
    assert after_four.op_saved_elems == 6 * k + e + shared
    assert after_four.op_recompute_matmul_params == 3 * k * h * fe + 2 * h * shared
    # After five: the router and w3 recomputed, w1 and w2 kept.
    assert after_five.op_saved_elems == 6 * k + shared + h
    assert after_five.op_recompute_matmul_params == 3 * k * h * fe + h * e + h * shared
    latent = LatentAttention(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16)
    costs = model_costs(_small(moe=MOE, latent_attention=latent), 1024)
    attention = latent_attention(h=h, heads=8, latent=latent, seq_len=1024).part  # five matmuls
    assert costs.blocks[1].op_saved_elems == attention.op_saved_elems + after_five.op_saved_elems

    routed = model_costs(_small(moe=MOE), 1024).blocks[1]
    # Tensor parallelism: the router's part stays whole (each rank routes the whole sequence).
    tp2 = tensor_parallel_share(model_costs(_small(moe=MOE), 1024), 2).blocks[1]
    router = routed.op_routing_elems
    assert tp2.op_saved_elems == (routed.op_saved_elems - router) / 2 + router
    # Expert parallelism: the rows received for the experts and their outputs received back.
    ep2 = expert_parallel_share(model_costs(_small(moe=MOE), 1024), 2).blocks[1]
    assert ep2.op_saved_elems == routed.op_saved_elems + 2 * k * h


def test_latent_attention_params_and_flops() -> None:
    latent = LatentAttention(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16)
    h, heads, s = 256, 8, 1024
    costs = model_costs(_small(latent_attention=latent), s)
    dense = model_costs(_small(), s)
    attention = (h * 64 + 64 * heads * 24) + h * (32 + 8) + 32 * heads * 32 + heads * 16 * h
    gqa = h * h + 2 * h * 128 + h * h
    block, plain = costs.blocks[0], dense.blocks[0]
    assert block.num_params - plain.num_params == attention + 64 + 32 - gqa
    assert block.attention_flops_convention == 2.0 * s * heads * (24 + 16)
    assert sum(i * o for i, outs in block.linear_shapes for o in outs) == block.matmul_params


def test_qk_norm_adds_two_head_wide_weights_per_block() -> None:
    plain = model_costs(_small(), 1024)
    normed = model_costs(_small(qk_norm=True), 1024)
    assert normed.num_params - plain.num_params == 4 * 2 * 32
    assert normed.blocks[0].elementwise_elems > plain.blocks[0].elementwise_elems


@pytest.mark.parametrize("field", ["moe", "latent_attention", "qk_norm"])
def test_llama_only_fields_are_refused_elsewhere(field: str) -> None:
    value = {"moe": MOE, "qk_norm": True, "latent_attention": LatentAttention(
        kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)}[field]
    with pytest.raises(ValueError, match=field):
        ModelSpec(name="g", architecture="gpt2", vocab_size=100, hidden_size=64, num_layers=2, num_heads=4,
                  **{field: value})
