"""What Hugging Face `config.json` files of the mixture-of-experts and Qwen3 families add to a llama
model: the experts, latent attention and query/key norms, read into the contract's `MoeConfig` and
`LatentAttention` (planner/catalog/models.py `model_from_hf_config` reads the rest, as for Llama).

Left out, as the catalog leaves them out (planner/catalog/moe_models.py says what each changes):
DeepSeek-V3's multi-token-prediction layers, gpt-oss' attention sinks, output-projection bias and
sliding windows, Llama 4's weight-free query/key norm, blocks without RoPE and chunked attention.
"""

from __future__ import annotations

from typing import Any

from contract.model_config import LatentAttention, MoeConfig
from planner.bounds import MAX_SEQ_LEN
from planner.errors import PlanningError

EXTENDED_ARCHITECTURES = (
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration",
)
"""Architectures read as the llama family with the fields below."""


def llama_extension(arch: str, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the config to read the llama fields from, the ModelSpec fields `arch` adds or replaces)."""
    if arch == "Qwen3ForCausalLM":
        return config, {"qk_norm": True}
    if arch == "Qwen3MoeForCausalLM":
        return config, {"qk_norm": True, "moe": _qwen3_moe(config)}
    if arch == "MixtralForCausalLM":
        return config, {"moe": MoeConfig(
            num_experts=_int(config, "num_local_experts"),
            experts_per_token=_int(config, "num_experts_per_tok"),
            expert_intermediate_size=_int(config, "intermediate_size"),
        )}
    if arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        # V2's config has V3's fields; its `topk_method` (greedy, group_limited_greedy) has no bias.
        return config, _deepseek_v3(config)
    if arch == "GptOssForCausalLM":
        return _gpt_oss(config)
    if arch in ("Llama4ForCausalLM", "Llama4ForConditionalGeneration"):
        return _llama4(config)
    return config, {}


def _qwen3_moe(config: dict[str, Any]) -> MoeConfig:
    if config.get("mlp_only_layers"):
        raise PlanningError(
            "config.json: `mlp_only_layers` lists dense blocks at chosen indices; the planner's model has "
            "dense blocks only first or between regular MoE steps (`decoder_sparse_step`), so it cannot be "
            "planned as it is (`mlp_only_layers`: [] can)",
            field="model",
        )
    step = _int(config, "decoder_sparse_step", 1)
    # Hugging Face routes block i when (i + 1) % step == 0: the first step - 1 are dense.
    return MoeConfig(
        # transformers 5 writes `num_experts` as `num_local_experts` (its config's attribute_map).
        num_experts=_int(config, "num_experts" if "num_experts" in config else "num_local_experts"),
        experts_per_token=_int(config, "num_experts_per_tok"),
        expert_intermediate_size=_int(config, "moe_intermediate_size"), first_dense_layers=step - 1,
        layer_interval=step,
    )


def _deepseek_v3(config: dict[str, Any]) -> dict[str, Any]:
    # `num_nextn_predict_layers` (multi-token prediction) is left out: the published totals leave it out.
    latent = LatentAttention(
        q_lora_rank=config.get("q_lora_rank") or None, kv_lora_rank=_int(config, "kv_lora_rank"),
        qk_nope_head_dim=_int(config, "qk_nope_head_dim"), qk_rope_head_dim=_int(config, "qk_rope_head_dim"),
        v_head_dim=_int(config, "v_head_dim"),
    )
    moe = MoeConfig(
        num_experts=_int(config, "n_routed_experts"), experts_per_token=_int(config, "num_experts_per_tok"),
        expert_intermediate_size=_int(config, "moe_intermediate_size"),
        num_shared_experts=_int(config, "n_shared_experts", 0),
        first_dense_layers=_int(config, "first_k_dense_replace", 0),
        layer_interval=_int(config, "moe_layer_freq", 1),
        router="sigmoid" if config.get("scoring_func", "sigmoid") == "sigmoid" else "softmax",
        router_bias=config.get("topk_method", "noaux_tc") == "noaux_tc",
    )
    return {"latent_attention": latent, "moe": moe, "head_size": None}


def _gpt_oss(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    # `attention_bias` puts biases on q, k, v (priced) and o (h per block, not priced); read here, so
    # that the llama reader's refusal of attention biases does not apply.
    bias = bool(config.get("attention_bias", True))
    top_k = config.get("num_experts_per_tok", config.get("experts_per_token"))
    moe = MoeConfig(
        num_experts=_int(config, "num_local_experts"), experts_per_token=_int({"k": top_k}, "k"),
        expert_intermediate_size=_int(config, "intermediate_size"), expert_bias=True,
    )
    read = {key: value for key, value in config.items() if key != "attention_bias"}
    return read, {"moe": moe, "qkv_bias": bias}


def _llama4(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    text = config.get("text_config") or config
    step = _int(text, "interleave_moe_layer_step", 1)
    moe = MoeConfig(
        num_experts=_int(text, "num_local_experts"), experts_per_token=_int(text, "num_experts_per_tok"),
        expert_intermediate_size=_int(text, "intermediate_size"), num_shared_experts=1,
        first_dense_layers=step - 1, layer_interval=step,
    )
    dense = _int(text, "intermediate_size_mlp", _int(text, "intermediate_size"))
    # Scout's 10M-token context is held to the longest a request may plan (planner/bounds.py).
    context = min(_int(text, "max_position_embeddings", 2048), MAX_SEQ_LEN)
    return text, {"moe": moe, "intermediate_size": dense, "max_seq_len": context}


def config_int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    """A whole-number field of a Hugging Face config.json; a missing one is named as missing (not as
    "got None"), with what to do about it."""
    value = config.get(key, default)
    if value is None:
        arch = ", ".join(config.get("architectures") or []) or "this model's"
        raise PlanningError(
            f"config.json: `{key}` is missing; a {arch} config gives it as a whole number (pass the "
            "model's config.json whole, as its Hugging Face repository has it)",
            field="model",
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanningError(f"config.json: `{key}` must be a whole number, got {value!r}", field="model")
    return value


_int = config_int  # the short name the readers above use
