"""Every field of a Hugging Face config.json that changes the model's shapes or parameter count is read,
or the config is refused naming it (issue 38 item 12: Mistral-NeMo's `head_dim` 128 at hidden 5120 and
32 heads was planned as heads 160 wide, 12.77B parameters instead of 12.25B, without a word)."""

from __future__ import annotations

from typing import Any

import pytest

from planner.catalog.models import resolve_model
from planner.cost.model_costs import count_parameters, model_costs
from planner.errors import PlanningError

# mistralai/Mistral-Nemo-Base-2407's config.json (the fields that shape it).
MISTRAL_NEMO: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 5120,
    "intermediate_size": 14336, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 131072, "max_position_embeddings": 1024000, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "sliding_window": None, "hidden_act": "silu",
}
NEMO_PUBLISHED = 12.25e9
"""Mistral-NeMo's 12,247,782,400 parameters (the model card's "12B"; the sum of its safetensors)."""
QWEN2_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 32768,
}
GPT2: dict[str, Any] = {"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12, "n_head": 12,
                        "vocab_size": 50257, "n_positions": 1024}


def test_mistral_nemo_plans_with_its_published_parameter_count() -> None:
    spec = resolve_model(MISTRAL_NEMO)
    assert (spec.head_dim, spec.attention_width, spec.head_size) == (128, 4096, 128)
    assert count_parameters(spec) == 12_247_782_400
    assert abs(count_parameters(spec) - NEMO_PUBLISHED) / NEMO_PUBLISHED < 0.005
    # Attention FLOPs follow the heads' width (32 x 128), not the hidden size.
    costs = model_costs(spec, 4096)
    assert costs.blocks[0].attention_flops_convention == 4.0 * 4096 * 4096


def test_a_head_dim_equal_to_hidden_over_heads_is_the_same_model() -> None:
    plain = {k: v for k, v in MISTRAL_NEMO.items() if k != "head_dim"} | {"num_attention_heads": 40}
    spelled = plain | {"head_dim": 128}
    assert resolve_model(spelled) == resolve_model(plain)
    assert resolve_model(spelled).head_size is None
    assert resolve_model(plain | {"head_dim": None}) == resolve_model(plain)


def test_qwen2_reads_its_biases_and_tied_head() -> None:
    spec = resolve_model(QWEN2_05B)
    assert spec.qkv_bias and spec.tie_word_embeddings
    assert abs(count_parameters(spec) - 494.0e6) / 494.0e6 < 0.005  # Qwen2-0.5B: 494M


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**MISTRAL_NEMO, "architectures": ["LlamaForCausalLM"], "attention_bias": True}, "attention_bias"),
        ({**MISTRAL_NEMO, "mlp_bias": True}, "mlp_bias"),
        ({**GPT2, "add_cross_attention": True}, "add_cross_attention"),
    ],
)
def test_a_shape_field_the_planner_has_no_model_for_is_refused_naming_it(
    config: dict[str, Any], field: str
) -> None:
    with pytest.raises(PlanningError, match=f"`{field}` is true") as refused:
        resolve_model(config)
    assert refused.value.field == "model"
    resolve_model({**config, field: False})  # the same config without it plans


@pytest.mark.parametrize("head_dim", ["128", 12.5, True, 0])
def test_a_head_dim_that_is_not_a_width_is_refused_naming_it(head_dim: object) -> None:
    with pytest.raises(PlanningError, match="head_dim"):
        resolve_model({**MISTRAL_NEMO, "head_dim": head_dim})


def test_heads_of_their_own_width_are_for_the_llama_family_only() -> None:
    gpt2 = resolve_model(GPT2).model_dump()
    with pytest.raises(ValueError, match="head_size: gpt2 heads are hidden_size / num_heads wide"):
        type(resolve_model(GPT2)).model_validate({**gpt2, "head_size": 32})
