"""Mixture-of-experts models of the catalog (planner/catalog/models.py lists them with the dense ones).

Dimensions from each model's published Hugging Face `config.json` (Llama 4: its `text_config`); the
published total and active parameter counts they give are checked in tests/planner/test_moe_catalog.py.
What a model has that the planner does not price is said in its comment; every entry is priced
without expert parallelism for now (experts sharded by FSDP like every parameter).
"""

from __future__ import annotations

from typing import Any

from contract.model_config import LatentAttention, MoeConfig
from planner.bounds import MAX_SEQ_LEN
from planner.specs import ModelSpec

_DEEPSEEK_LATENT = LatentAttention(
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
)
"""DeepSeek-V3's (and Kimi K2's) multi-head latent attention."""


def _moe(name: str, *, moe: MoeConfig, **dims: Any) -> ModelSpec:
    return ModelSpec(name=name, architecture="llama", moe=moe, **dims)


def _mixtral(
    name: str, *, hidden: int, layers: int, heads: int, ffn: int, vocab: int, context: int
) -> ModelSpec:
    return _moe(
        name,
        moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=ffn),
        vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=8,
        intermediate_size=ffn, max_seq_len=context, rope_theta=1000000.0,
    )


def _qwen3_moe(name: str, *, hidden: int, layers: int, heads: int, expert: int, dense: int) -> ModelSpec:
    # Every block routes (decoder_sparse_step 1, no mlp_only_layers): `intermediate_size` is unused.
    return _moe(
        name,
        moe=MoeConfig(num_experts=128, experts_per_token=8, expert_intermediate_size=expert),
        vocab_size=151936, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=4,
        head_size=128, intermediate_size=dense, max_seq_len=40960, rope_theta=1000000.0, norm_eps=1e-6,
        qk_norm=True,
    )


def _deepseek(name: str, *, vocab: int, heads: int, experts: int, dense_layers: int, context: int,
              rope_theta: float) -> ModelSpec:
    # The multi-token-prediction module (DeepSeek-V3's one MTP depth, 14B more parameters) is left out,
    # as the published 671B total leaves it out.
    return _moe(
        name,
        moe=MoeConfig(
            num_experts=experts, experts_per_token=8, expert_intermediate_size=2048, num_shared_experts=1,
            first_dense_layers=dense_layers, router="sigmoid", router_bias=True,
        ),
        latent_attention=_DEEPSEEK_LATENT,
        vocab_size=vocab, hidden_size=7168, num_layers=61, num_heads=heads, intermediate_size=18432,
        max_seq_len=context, rope_theta=rope_theta, norm_eps=1e-6,
    )


def _deepseek_v2_lite(name: str) -> ModelSpec:
    # DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite config.json); torchtitan's `deepseek_v3` flavor
    # "16B" (torchtitan/models/deepseek_v3/__init__.py) has exactly these dimensions: queries projected
    # from the hidden state (q_lora_rank 0), 64 routed experts top-6 with softmax scores plus 2 shared,
    # the first block dense. Its YaRN rope scaling (attention-score scale only) is not modelled.
    return _moe(
        name,
        moe=MoeConfig(
            num_experts=64, experts_per_token=6, expert_intermediate_size=1408, num_shared_experts=2,
            first_dense_layers=1, router="softmax",
        ),
        latent_attention=LatentAttention(
            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
        ),
        vocab_size=102400, hidden_size=2048, num_layers=27, num_heads=16, intermediate_size=10944,
        max_seq_len=163840, rope_theta=10000.0, norm_eps=1e-6,
    )


def _gpt_oss(name: str, *, layers: int, experts: int) -> ModelSpec:
    # Priced as full attention with q/k/v biases: its attention sinks (one learned logit per head), the
    # output projection's bias (together under 0.01% of the parameters) and the sliding windows of
    # every other block (128 tokens) are not modelled, so the windowed blocks' attention is over-priced.
    return _moe(
        name,
        moe=MoeConfig(
            num_experts=experts, experts_per_token=4, expert_intermediate_size=2880, expert_bias=True
        ),
        vocab_size=201088, hidden_size=2880, num_layers=layers, num_heads=64, num_kv_heads=8, head_size=64,
        intermediate_size=2880, max_seq_len=131072, rope_theta=150000.0, qkv_bias=True,
    )


def _llama4(name: str, *, experts: int, interval: int) -> ModelSpec:
    # The text model. Its weight-free L2 norm on queries and keys, the blocks without RoPE (every
    # fourth) and chunked attention are not modelled (priced as full attention with RoPE); the
    # interleaved blocks (Maverick) are dense at `intermediate_size_mlp`. Scout's 10M-token context is
    # held to the longest a request may plan (planner/bounds.py).
    return _moe(
        name,
        moe=MoeConfig(
            num_experts=experts, experts_per_token=1, expert_intermediate_size=8192, num_shared_experts=1,
            first_dense_layers=interval - 1, layer_interval=interval,
        ),
        vocab_size=202048, hidden_size=5120, num_layers=48, num_heads=40, num_kv_heads=8, head_size=128,
        intermediate_size=16384, max_seq_len=MAX_SEQ_LEN, rope_theta=500000.0,
    )


MOE_MODELS: tuple[ModelSpec, ...] = (
    _mixtral("mixtral-8x7b", hidden=4096, layers=32, heads=32, ffn=14336, vocab=32000, context=32768),
    _mixtral("mixtral-8x22b", hidden=6144, layers=56, heads=48, ffn=16384, vocab=32768, context=65536),
    _qwen3_moe("qwen3-30b-a3b", hidden=2048, layers=48, heads=32, expert=768, dense=6144),
    _qwen3_moe("qwen3-235b-a22b", hidden=4096, layers=94, heads=64, expert=1536, dense=12288),
    _deepseek("deepseek-v3", vocab=129280, heads=128, experts=256, dense_layers=3, context=163840,
              rope_theta=10000.0),
    _deepseek("kimi-k2", vocab=163840, heads=64, experts=384, dense_layers=1, context=131072,
              rope_theta=50000.0),
    _deepseek_v2_lite("deepseek-v2-lite"),
    _gpt_oss("gpt-oss-20b", layers=24, experts=32),
    _gpt_oss("gpt-oss-120b", layers=36, experts=128),
    _llama4("llama4-scout", experts=16, interval=1),
    _llama4("llama4-maverick", experts=128, interval=2),
)
"""The mixture-of-experts catalog entries, in the order `fsdp-planner` lists them."""
