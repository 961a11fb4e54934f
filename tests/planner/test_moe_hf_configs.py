"""Hugging Face config.json files of the MoE families and Qwen3, read into model specs (hand-written
configs with the published models' fields; nothing downloaded): each reads as the catalog entry of the
same model, and a small one of each family plans."""

from __future__ import annotations

from typing import Any

import pytest

from planner.bounds import MAX_SEQ_LEN
from planner.catalog.models import catalog_model, model_from_hf_config
from planner.cost.model_costs import model_costs
from planner.errors import PlanningError

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "tie_word_embeddings": False,
}
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
    "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": False,
    "scoring_func": "softmax", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "attention_bias": False, "tie_word_embeddings": False,
}
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "attention_bias": False,
}
QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": False, "attention_bias": False,
}
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
    "attention_bias": True, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "tie_word_embeddings": False,
}
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1e6, "tie_word_embeddings": False,
}
LLAMA4_MAVERICK: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text", "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 128, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2, "use_qk_norm": False, "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    },
}

SAME_AS_CATALOG = [
    (DEEPSEEK_V3, "deepseek-v3"),
    (DEEPSEEK_V2_LITE, "deepseek-v2-lite"),
    (QWEN3_30B_A3B, "qwen3-30b-a3b"),
    (QWEN3_8B, "qwen3-8b"),
    (GPT_OSS_20B, "gpt-oss-20b"),
    (MIXTRAL_8X7B, "mixtral-8x7b"),
    (LLAMA4_MAVERICK, "llama4-maverick"),
]


@pytest.mark.parametrize(("config", "name"), SAME_AS_CATALOG, ids=[n for _, n in SAME_AS_CATALOG])
def test_config_reads_as_the_catalog_entry(config: dict[str, Any], name: str) -> None:
    spec = model_from_hf_config(config, name=name)
    entry = catalog_model(name)
    assert spec.moe == entry.moe
    assert spec.latent_attention == entry.latent_attention
    assert spec.qk_norm == entry.qk_norm
    ours, theirs = model_costs(spec, 4096), model_costs(entry, 4096)
    assert ours.num_params == theirs.num_params
    assert ours.active_params == theirs.active_params
    assert ours.flops_per_token == theirs.flops_per_token


def test_small_deepseek_config_without_query_latent() -> None:
    # DeepSeek-V2-Lite's shape: queries projected directly (q_lora_rank null), experts from block 1.
    small = DEEPSEEK_V3 | {
        "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "q_lora_rank": None, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1,
    }
    spec = model_from_hf_config(small)
    assert spec.latent_attention is not None and spec.latent_attention.q_lora_rank is None
    costs = model_costs(spec, 128)
    assert [b.routed_experts for b in costs.blocks] == [0, 8, 8]
    first = costs.blocks[0]
    assert sum(i * o for i, outs in first.linear_shapes for o in outs) == first.matmul_params


def test_qwen3_moe_with_chosen_dense_layers_is_refused() -> None:
    with pytest.raises(PlanningError, match="mlp_only_layers"):
        model_from_hf_config(QWEN3_30B_A3B | {"mlp_only_layers": [0, 5]})


def test_expert_field_out_of_bounds_is_a_planning_error() -> None:
    with pytest.raises(PlanningError, match="num_experts"):
        model_from_hf_config(MIXTRAL_8X7B | {"num_local_experts": 1})


def test_llama4_text_config_on_its_own_and_scouts_context_held_to_the_bound() -> None:
    scout = LLAMA4_MAVERICK["text_config"] | {
        "num_local_experts": 16, "interleave_moe_layer_step": 1, "max_position_embeddings": 10485760,
    }
    spec = model_from_hf_config({"architectures": ["Llama4ForCausalLM"], **scout}, name="llama4-scout")
    entry = catalog_model("llama4-scout")
    assert spec.moe == entry.moe and spec.max_seq_len == entry.max_seq_len == MAX_SEQ_LEN
    assert model_costs(spec, 4096).num_params == model_costs(entry, 4096).num_params
