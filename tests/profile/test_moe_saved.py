"""The planner's mixture-of-experts and query/key-norm blocks against the runtime's, built from the same
spec: parameters equal, and what a real CPU bf16 forward keeps for backward (saved-tensor hooks, as
tests/profile/test_trace.py measures dense blocks) within the same 2% of what the planner prices.

Latent attention's parameters are checked here; its saved bytes are not: on the CPU, SDPA runs
attention with query/key and value heads of different widths through its math path, which keeps the
whole score matrix, where the GPU's fused kernels (and the planner) keep queries, keys, values, output
and one log-sum-exp per head."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from contract.model_config import LatentAttention, ModelConfig, MoeConfig
from executor.runtime.materialize import materialize
from executor.runtime.models import Llama
from planner.cost.model_costs import eager_saved_bytes, model_costs
from planner.specs import ModelSpec
from tests.profile.test_trace import SEQ, TOLERANCE, real_saved_bytes_per_token

DIMS = dict(name="tiny", architecture="llama", vocab_size=2048, hidden_size=256, num_layers=2, num_heads=8,
            num_kv_heads=4, intermediate_size=768, max_seq_len=2048)
ROUTED = MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=128)
CASES = {
    "moe": {"moe": ROUTED},
    "moe-shared-after-dense": {"moe": replace(ROUTED, num_shared_experts=1, first_dense_layers=1)},
    "expert-biases": {"moe": replace(ROUTED, expert_bias=True), "qkv_bias": True},
    "qk-norm": {"qk_norm": True, "head_size": 32},
}


def _built(changes: dict) -> tuple[Llama, ModelSpec]:
    dims = DIMS | changes
    model = Llama(ModelConfig(**dims), seq_len=SEQ)
    materialize(model, device=torch.device("cpu"), seed=0)
    return model, ModelSpec(**dims)


@pytest.mark.parametrize("case", list(CASES))
def test_blocks_keep_what_the_planner_prices(case: str) -> None:
    model, spec = _built(CASES[case])
    costs = model_costs(spec, SEQ)
    assert sum(p.numel() for p in model.parameters()) == costs.num_params
    real = real_saved_bytes_per_token(model, model.layers, vocab=spec.vocab_size)
    for i, (measured, block) in enumerate(zip(real, costs.blocks, strict=True)):
        assert sum(p.numel() for p in model.layers[i].parameters()) == block.num_params
        # fp32 statistics the planner leaves out: an rstd per norm (and per q/k head), a log-sum-exp per head.
        norms = 2 + (spec.num_heads + spec.kv_heads if spec.qk_norm else 0)
        expected = eager_saved_bytes(block, 2) + 4 * (norms + spec.num_heads)
        assert abs(measured - expected) <= TOLERANCE * expected, f"block {i}: {measured} vs {expected}"


def test_latent_attention_parameters_match_the_runtime() -> None:
    latent = LatentAttention(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16)
    model, spec = _built({"num_kv_heads": None, "latent_attention": latent, "moe": ROUTED})
    costs = model_costs(spec, SEQ)
    assert sum(p.numel() for p in model.parameters()) == costs.num_params
    built = [sum(p.numel() for p in b.parameters()) for b in model.layers]
    assert built == [b.num_params for b in costs.blocks]
