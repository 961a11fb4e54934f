"""Hugging Face checkpoints of the mixture-of-experts and Qwen3 families, for `executor.runtime.hf`:
their config.json fields beyond Llama's, what the runtime cannot compute, and their tensor names.

Read (config.json `architectures[0]` -> the runtime's `llama` model with):
  Qwen3ForCausalLM        query/key norms (`qk_norm`)
  Qwen3MoeForCausalLM     query/key norms, routed experts (softmax router, top-k renormalised)
  MixtralForCausalLM      routed experts (softmax router, top-k renormalised)
  DeepseekV3ForCausalLM   latent attention, routed and shared experts, leading dense blocks, a sigmoid
                          router whose per-expert bias (`e_score_correction_bias`) chooses
Refused, naming what the runtime's model does not compute: GptOssForCausalLM and Llama 4.

Names, runtime <- Hugging Face (`model.layers.N.` prefix left out; Mixtral's `block_sparse_moe` for `mlp`):
  attention.q_norm / k_norm            self_attn.q_norm / k_norm                          (Qwen3)
  attention.wq_a / q_norm / wq_b       self_attn.q_a_proj / q_a_layernorm / q_b_proj      (latent)
  attention.wkv_a / kv_norm / wkv_b    self_attn.kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj
  feed_forward.router.gate.weight      mlp.gate.weight
  feed_forward.router.score_bias       mlp.gate.e_score_correction_bias                   (a buffer)
  feed_forward.experts.w1 [E, h, f]    mlp.experts.{e}.gate_proj.weight [f, h], e = 0..E-1 (Mixtral: w1)
  feed_forward.experts.w3 [E, h, f]    mlp.experts.{e}.up_proj.weight   [f, h]              (Mixtral: w3)
  feed_forward.experts.w2 [E, f, h]    mlp.experts.{e}.down_proj.weight [h, f]              (Mixtral: w2)
  feed_forward.shared.w1 / w3 / w2     mlp.shared_experts.gate_proj / up_proj / down_proj
The routed experts are one stacked parameter in the runtime (the grouped matmul's layout) and one
matrix per expert in the checkpoint, each the transpose of its slice.

DeepSeek's rotary dimensions: with `rope_interleave` (transformers' default for DeepseekV3) the rope
part of each query head (q_b_proj / q_proj rows) and of the shared rotary key (the last rows of
kv_a_proj_with_mqa) is stored as interleaved pairs (x0, x1), (x2, x3), ...; the runtime rotates halves
(x0, x2, ... | x1, x3, ...), so those rows are read in that order and written back in theirs. The dot
products are the same: transformers computes exactly this de-interleaving before its rotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from contract.model_config import ModelConfig

MOE_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
"""The llama-family architectures this module adds (class name -> model_type)."""

REFUSED_ARCHITECTURES = {
    "GptOssForCausalLM": (
        "attention sinks, a bias on o_proj, sliding-window layers, YaRN RoPE and gpt-oss' clamped "
        "SwiGLU (swiglu_alpha, swiglu_limit, up + 1) with gate and up interleaved in gate_up_proj"
    ),
    "Llama4ForCausalLM": (
        "blocks without RoPE (no_rope_layers), chunked attention, the weight-free L2 query/key norm, "
        "attention temperature tuning, and a router that scales each expert's input (not its output) "
        "by its sigmoid score"
    ),
}
REFUSED_ARCHITECTURES["Llama4ForConditionalGeneration"] = REFUSED_ARCHITECTURES["Llama4ForCausalLM"]
"""Architectures the planner plans but whose checkpoints the runtime's model would compute differently:
what it lacks, for the refusal."""

_EXPERT_LEAVES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_ATTENTION = {
    "attention.q_norm": "self_attn.q_norm",
    "attention.k_norm": "self_attn.k_norm",
    "attention.wkv_a": "self_attn.kv_a_proj_with_mqa",
    "attention.kv_norm": "self_attn.kv_a_layernorm",
    "attention.wkv_b": "self_attn.kv_b_proj",
    "attention.wq_a": "self_attn.q_a_proj",
    "attention.wq_b": "self_attn.q_b_proj",
}


@dataclass(frozen=True, slots=True)
class RopeRows:
    """Rows of a projection whose rotary part is stored as interleaved pairs: in each `period` rows
    (one head's query, or the key/value latent plus the rotary key), the last `width`."""

    period: int
    width: int

    def order(self, rows: int) -> torch.Tensor:
        """Runtime row i is checkpoint row order[i] (int64 [rows])."""
        within = torch.arange(self.period)
        start = self.period - self.width
        within[start:] = start + torch.cat([torch.arange(0, self.width, 2), torch.arange(1, self.width, 2)])
        heads = torch.arange(rows // self.period).unsqueeze(1) * self.period
        return (heads + within).flatten()


@dataclass(frozen=True, slots=True)
class Naming:
    """How one checkpoint family names the runtime's MoE and latent-attention parameters."""

    feed_forward: str = "mlp"
    """The feed-forward module's name (`block_sparse_moe` in Mixtral checkpoints)."""
    expert_leaves: bool = True
    """Experts' projections named gate_proj / up_proj / down_proj; False: w1 / w3 / w2 (Mixtral)."""
    rope_interleave: bool = False
    """DeepSeek's interleaved rotary rows (`RopeRows`)."""


def naming(model: ModelConfig, config: dict[str, Any] | None) -> Naming:
    """The names of `config`'s checkpoint (None: the family `export_architecture` writes)."""
    arch = hf_architecture_of(config) if config else export_architecture(model)
    mixtral = arch == "MixtralForCausalLM"
    interleave = model.latent_attention is not None and bool((config or {}).get("rope_interleave", True))
    return Naming(
        feed_forward="block_sparse_moe" if mixtral else "mlp",
        expert_leaves=not mixtral,
        rope_interleave=interleave,
    )


def hf_architecture_of(config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else ""


def export_architecture(model: ModelConfig) -> str | None:
    """The Hugging Face class a plan's model is written as when no original config.json is given
    (None: not one of this module's families)."""
    if model.latent_attention is not None:
        return "DeepseekV3ForCausalLM"
    if model.moe is not None:
        return "Qwen3MoeForCausalLM" if model.qk_norm else "MixtralForCausalLM"
    return "Qwen3ForCausalLM" if model.qk_norm else None


def block_names(
    model: ModelConfig, module: str, leaf: str, layer: str, names: Naming
) -> list[tuple[str, int | None]] | None:
    """The checkpoint names (with the expert each is, for stacked experts) of runtime parameter
    `layers.<layer>.<module>.<leaf>`, or None when this module does not name it."""
    prefix = f"model.layers.{layer}."
    if module == "attention.q_norm" and model.latent_attention is not None:
        return [(f"{prefix}self_attn.q_a_layernorm.{leaf}", None)]
    if module in _ATTENTION:
        return [(f"{prefix}{_ATTENTION[module]}.{leaf}", None)]
    ff = prefix + names.feed_forward
    if module == "feed_forward.router.gate":
        return [(f"{ff}.gate.{leaf}", None)]
    if module == "feed_forward.router" and leaf == "score_bias":
        return [(f"{ff}.gate.e_score_correction_bias", None)]
    if module.startswith("feed_forward.shared."):
        proj = _EXPERT_LEAVES[module.rsplit(".", 1)[1]]
        return [(f"{ff}.shared_experts.{proj}.{leaf}", None)]
    if module == "feed_forward.experts" and leaf in _EXPERT_LEAVES and model.moe is not None:
        proj = _EXPERT_LEAVES[leaf] if names.expert_leaves else leaf
        return [(f"{ff}.experts.{e}.{proj}.weight", e) for e in range(model.moe.num_experts)]
    return None


def rope_rows(model: ModelConfig, module: str, names: Naming) -> RopeRows | None:
    """The interleaved rotary rows of a latent-attention projection, when the checkpoint has them."""
    mla = model.latent_attention
    if mla is None or not names.rope_interleave:
        return None
    if module in ("attention.wq", "attention.wq_b"):
        return RopeRows(period=mla.qk_head_dim, width=mla.qk_rope_head_dim)
    if module == "attention.wkv_a":
        return RopeRows(period=mla.kv_lora_rank + mla.qk_rope_head_dim, width=mla.qk_rope_head_dim)
    return None


def expected_fields(config: dict[str, Any], arch: str) -> dict[str, tuple[str, Any]]:
    """The plan's model fields (dotted: `moe.num_experts`) -> (config.json key, its value)."""
    fields: dict[str, tuple[str, Any]] = {}
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        fields["qk_norm"] = ("q_norm/k_norm", True)
    if arch == "Qwen3MoeForCausalLM":
        experts = "num_experts" if "num_experts" in config else "num_local_experts"
        step = config.get("decoder_sparse_step", 1)
        fields |= {
            "moe.num_experts": (experts, config.get(experts)),
            "moe.expert_intermediate_size": ("moe_intermediate_size", config.get("moe_intermediate_size")),
            "moe.layer_interval": ("decoder_sparse_step", step),
            "moe.first_dense_layers": (
                "decoder_sparse_step - 1", step - 1 if isinstance(step, int) else step
            ),
        }
    if arch == "MixtralForCausalLM":
        fields |= {
            "moe.num_experts": ("num_local_experts", config.get("num_local_experts")),
            "moe.expert_intermediate_size": ("intermediate_size", config.get("intermediate_size")),
            "moe.first_dense_layers": ("dense blocks", 0),
            "moe.num_shared_experts": ("shared experts", 0),
        }
    if arch == "DeepseekV3ForCausalLM":
        fields |= {
            "moe.num_experts": ("n_routed_experts", config.get("n_routed_experts")),
            "moe.expert_intermediate_size": ("moe_intermediate_size", config.get("moe_intermediate_size")),
            "moe.num_shared_experts": ("n_shared_experts", config.get("n_shared_experts", 0)),
            "moe.first_dense_layers": ("first_k_dense_replace", config.get("first_k_dense_replace", 0)),
            "moe.layer_interval": ("moe_layer_freq", config.get("moe_layer_freq", 1)),
            "moe.router": ("scoring_func", config.get("scoring_func", "sigmoid")),
            "moe.router_bias": ("topk_method noaux_tc", config.get("topk_method", "noaux_tc") == "noaux_tc"),
            "latent_attention.q_lora_rank": ("q_lora_rank", config.get("q_lora_rank") or None),
            "latent_attention.kv_lora_rank": ("kv_lora_rank", config.get("kv_lora_rank")),
            "latent_attention.qk_nope_head_dim": ("qk_nope_head_dim", config.get("qk_nope_head_dim")),
            "latent_attention.qk_rope_head_dim": ("qk_rope_head_dim", config.get("qk_rope_head_dim")),
            "latent_attention.v_head_dim": ("v_head_dim", config.get("v_head_dim")),
        }
    if arch in ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM"):
        fields["moe.experts_per_token"] = ("num_experts_per_tok", config.get("num_experts_per_tok"))
    return fields


def planned(model: ModelConfig, field: str) -> Any:
    """The plan's value of a dotted field (None where the model has no such part)."""
    value: Any = model
    for part in field.split("."):
        value = getattr(value, part, None)
    return value


def unsupported(config: dict[str, Any], arch: str) -> list[str]:
    """What of `arch`'s config.json the runtime's MoE and latent-attention blocks would compute
    differently (the llama checks run too)."""
    problems = []
    routed = arch in ("Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM")
    if routed and not config.get("norm_topk_prob", arch == "DeepseekV3ForCausalLM"):
        problems.append("norm_topk_prob false (the runtime renormalises the top-k routing weights to 1)")
    if arch == "Qwen3MoeForCausalLM" and config.get("mlp_only_layers"):
        problems.append("mlp_only_layers (the runtime's dense blocks come first or between MoE steps)")
    if arch == "DeepseekV3ForCausalLM":
        scale = config.get("routed_scaling_factor", 1.0)
        if scale != 1.0:
            problems.append(
                f"routed_scaling_factor {scale} (the runtime's routing weights sum to 1, unscaled)"
            )
        groups, chosen = config.get("n_group") or 1, config.get("topk_group") or 1
        if chosen < groups:
            problems.append(
                f"group-limited routing (topk_group {chosen} of n_group {groups}; the runtime's router "
                "chooses among all experts)"
            )
        if config.get("scoring_func", "sigmoid") not in ("sigmoid", "softmax"):
            problems.append(f"scoring_func {config.get('scoring_func')!r}")
    return problems


def export_fields(model: ModelConfig, arch: str) -> dict[str, Any]:
    """config.json fields of `arch` (from `export_architecture`) for the plan's model written from
    scratch; WeightsError where that class cannot hold the model as planned."""
    from executor.runtime.safetensors_io import WeightsError  # the errors' home, beside the reader

    fields: dict[str, Any] = {
        "architectures": [arch], "model_type": MOE_ARCHITECTURES[arch], "hidden_act": "silu",
        "attention_bias": False, "rope_scaling": None,
    }
    moe = model.moe
    if arch == "Qwen3ForCausalLM" or moe is None:
        return fields | {"use_sliding_window": False}
    fields |= {"num_experts_per_tok": moe.experts_per_token, "norm_topk_prob": True}
    if arch == "Qwen3MoeForCausalLM" and moe.first_dense_layers == moe.layer_interval - 1 and not (
        moe.num_shared_experts or moe.router_bias or moe.expert_bias
    ):
        return fields | {
            "num_experts": moe.num_experts, "moe_intermediate_size": moe.expert_intermediate_size,
            "decoder_sparse_step": moe.layer_interval, "mlp_only_layers": [], "use_sliding_window": False,
        }
    if arch == "MixtralForCausalLM" and moe.first_dense_layers == 0 and moe.layer_interval == 1 and not (
        moe.num_shared_experts or moe.router_bias or moe.expert_bias or moe.router != "softmax"
    ) and moe.expert_intermediate_size == model.ffn_size:
        return fields | {"num_local_experts": moe.num_experts, "sliding_window": None}
    mla = model.latent_attention
    shared_as_routed = moe.shared_size == moe.expert_intermediate_size  # DeepSeek sizes them alike
    if arch == "DeepseekV3ForCausalLM" and mla is not None and shared_as_routed:
        return fields | {
            "n_routed_experts": moe.num_experts, "n_shared_experts": moe.num_shared_experts,
            "moe_intermediate_size": moe.expert_intermediate_size,
            "first_k_dense_replace": moe.first_dense_layers,
            "moe_layer_freq": moe.layer_interval, "scoring_func": moe.router,
            "topk_method": "noaux_tc" if moe.router_bias else "greedy", "routed_scaling_factor": 1.0,
            "n_group": 1, "topk_group": 1, "q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
            "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
            "v_head_dim": mla.v_head_dim, "head_dim": mla.qk_rope_head_dim, "rope_interleave": True,
        }
    raise WeightsError(
        f"export: the plan's model {model.name!r} has no Hugging Face class that holds its experts as "
        f"planned ({arch} cannot); pass the original checkpoint with --hf-config DIR"
    )
