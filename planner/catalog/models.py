"""Model catalog (published architectures) and conversion of any model input into a ModelSpec."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from contract.fields import FieldError
from planner.catalog.hf_moe import EXTENDED_ARCHITECTURES, llama_extension
from planner.catalog.hf_moe import config_int as _int
from planner.catalog.moe_models import MOE_MODELS
from planner.errors import (
    PlanningError,
    UnknownCatalogEntryError,
    UnsupportedArchitectureError,
    describe_validation_error,
    did_you_mean,
)
from planner.specs import ModelSpec


def _llama(name: str, **dims: Any) -> ModelSpec:
    return ModelSpec(name=name, architecture="llama", **dims)


def _gpt2(name: str, hidden: int, layers: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        architecture="gpt2",
        vocab_size=50257,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        max_seq_len=1024,
        tie_word_embeddings=True,
        norm_eps=1e-5,
    )


MODEL_CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _llama(
            "llama2-7b",
            vocab_size=32000,
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            intermediate_size=11008,
            max_seq_len=4096,
        ),
        _llama(
            "llama3-8b",
            vocab_size=128256,
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            max_seq_len=8192,
            rope_theta=500000.0,
        ),
        _llama(
            "llama3-70b",
            vocab_size=128256,
            hidden_size=8192,
            num_layers=80,
            num_heads=64,
            num_kv_heads=8,
            intermediate_size=28672,
            max_seq_len=8192,
            rope_theta=500000.0,
        ),
        _llama(
            "llama3.1-405b",
            vocab_size=128256,
            hidden_size=16384,
            num_layers=126,
            num_heads=128,
            num_kv_heads=8,
            intermediate_size=53248,
            max_seq_len=131072,
            rope_theta=500000.0,
        ),
        _llama(
            "mistral-7b",
            vocab_size=32000,
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            max_seq_len=32768,
            rope_theta=1000000.0,
        ),
        _llama(
            "qwen3-8b",
            vocab_size=151936,
            hidden_size=4096,
            num_layers=36,
            num_heads=32,
            num_kv_heads=8,
            head_size=128,
            intermediate_size=12288,
            max_seq_len=40960,
            rope_theta=1000000.0,
            norm_eps=1e-6,
            qk_norm=True,
        ),
        *MOE_MODELS,
        _gpt2("gpt2", 768, 12, 12),
        _gpt2("gpt2-medium", 1024, 24, 16),
        _gpt2("gpt2-large", 1280, 36, 20),
        _gpt2("gpt2-xl", 1600, 48, 25),
        # A few million parameters: small enough to train on two CPU ranks in tests.
        _llama(
            "llama-debug",
            vocab_size=2048,
            hidden_size=256,
            num_layers=4,
            num_heads=8,
            num_kv_heads=4,
            intermediate_size=768,
            max_seq_len=2048,
        ),
    )
}

# `llama3.1-8b` and friends share their dims with Llama 3.
_ALIASES = {"llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b", "llama3-405b": "llama3.1-405b"}

_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "GPT2LMHeadModel": "gpt2",
    **dict.fromkeys(EXTENDED_ARCHITECTURES, "llama"),
}


def catalog_model(name: str) -> ModelSpec:
    """The catalog entry for a model name, case-insensitively."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    spec = MODEL_CATALOG.get(key)
    if spec is None:
        known = ", ".join(MODEL_CATALOG)
        raise UnknownCatalogEntryError(
            f"unknown model {name!r}{did_you_mean(name, [*MODEL_CATALOG, *_ALIASES])}; known models: "
            f"{known}. For another model pass its Hugging Face config.json or a layer graph from "
            "`fsdp-planner trace`",
            field="model",
        )
    return spec


def model_from_hf_config(config: dict[str, Any], *, name: str | None = None) -> ModelSpec:
    """Turn a Hugging Face `config.json` (as a dict) into a ModelSpec."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not architectures:
        raise UnsupportedArchitecture("<missing>", detail="config.json has no `architectures` list")
    arch = str(architectures[0])
    family = _HF_ARCHITECTURES.get(arch)
    if family is None:
        raise UnsupportedArchitecture(arch)
    display = name or str(config.get("_name_or_path") or config.get("model_type") or arch)
    try:
        config, extension = llama_extension(arch, config) if family == "llama" else (config, {})
        _refuse_unread_shapes(config, family)
        if family == "gpt2":
            return ModelSpec(
                name=display,
                architecture="gpt2",
                vocab_size=_int(config, "vocab_size"),
                hidden_size=_int(config, "n_embd"),
                num_layers=_int(config, "n_layer"),
                num_heads=_int(config, "n_head"),
                intermediate_size=config.get("n_inner") or None,
                max_seq_len=_int(config, "n_positions", 1024),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
                norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
            )
        dims: dict[str, Any] = dict(
            name=display,
            architecture="llama",
            vocab_size=_int(config, "vocab_size"),
            hidden_size=_int(config, "hidden_size"),
            num_layers=_int(config, "num_hidden_layers"),
            num_heads=_int(config, "num_attention_heads"),
            num_kv_heads=config.get("num_key_value_heads") or None,
            head_size=_head_size(config),
            intermediate_size=_int(config, "intermediate_size"),
            max_seq_len=_int(config, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM",
            rope_theta=_rope_theta(config),
            norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        )
        return ModelSpec(**(dims | extension))
    except ValidationError as exc:
        raise PlanningError(
            "config.json: " + "; ".join(describe_validation_error(exc)), field="model"
        ) from None
    except FieldError as exc:  # an expert or latent field out of its bounds (contract.model_config)
        raise PlanningError(f"config.json: {exc}", field="model") from None


_UNPRICED_SHAPES: dict[str, tuple[tuple[str, object, str], ...]] = {
    # family: (config.json field, the value the planner's model has, what a different one changes)
    "llama": (
        ("attention_bias", False, "biases on q, k, v and o (Qwen2ForCausalLM's q/k/v biases are priced)"),
        ("mlp_bias", False, "biases on the feed-forward's three projections"),
    ),
    "gpt2": (("add_cross_attention", False, "a cross-attention block in every layer"),),
}
"""config.json fields that change a supported architecture's shapes or parameter count and that neither
the cost model nor the runtime's model has: a config that sets one is refused, naming it, instead of
being planned as a different model. (The fields they do have are read above: sizes, `head_dim`,
`num_key_value_heads`, `intermediate_size` / `n_inner`, `tie_word_embeddings`, Qwen2's q/k/v biases.)"""


def _refuse_unread_shapes(config: dict[str, Any], family: str) -> None:
    for key, planned, meaning in _UNPRICED_SHAPES[family]:
        value = config.get(key, planned)
        if value is not None and value != planned:
            raise PlanningError(
                f"config.json: `{key}` is {json.dumps(value, default=str)}, which adds {meaning}; the "
                f"planner and the runtime's model have none, so this model cannot be planned as it is "
                f"(`{key}`: {json.dumps(planned)} can)",
                field="model",
            )


def _rope_theta(config: dict[str, Any]) -> float:
    """RoPE's base: `rope_theta`, or where transformers 5 writes it (`rope_parameters.rope_theta`)."""
    params = config.get("rope_parameters")
    nested = params.get("rope_theta") if isinstance(params, dict) else None
    theta = config.get("rope_theta", nested)
    return float(10000.0 if theta is None else theta)


def _head_size(config: dict[str, Any]) -> int | None:
    """config.json's `head_dim` (Mistral-NeMo: 128 at hidden 5120 and 32 heads), or None where it is
    missing, null, or hidden_size / num_attention_heads anyway (so that such a config plans, and
    hashes, as the same model without it)."""
    if config.get("head_dim") is None:
        return None
    head_dim = _int(config, "head_dim")
    if head_dim < 1:
        raise PlanningError(f"config.json: `head_dim` must be a positive width, not {head_dim}",
                            field="model")
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and head_dim * heads == hidden:
        return None
    return head_dim


class UnsupportedArchitecture(UnsupportedArchitectureError):
    def __init__(self, arch: str, *, detail: str | None = None) -> None:
        supported = ", ".join(_HF_ARCHITECTURES)
        lead = detail or f"unsupported architecture {arch}"
        super().__init__(f"{lead}; supported: {supported}", field="model")


def _shape_advice(value: dict[str, Any]) -> str:
    """What to send instead of an object that is neither a model spec nor a config.json: most often a
    catalog model wrapped in an object (`{"name": "llama3-8b"}`), where a plain string was meant."""
    name = value.get("name")
    known = isinstance(name, str) and name.strip().lower() in {*MODEL_CATALOG, *_ALIASES}
    if known:
        lead = f'to plan the catalog model {name!r}, pass its name as a string: "model": "{name}"'
    else:
        lead = (
            'to plan a catalog model, pass its name as a string, e.g. "model": "llama3-8b" (catalog: '
            f"{', '.join(MODEL_CATALOG)})"
        )
    return (
        f"model: {lead}; an object must be a full model spec (`architecture`: llama, gpt2 or layer_graph, "
        "with its dimensions), a Hugging Face config.json (with `architectures`), or a layer graph from "
        "`fsdp-planner trace`"
    )


def resolve_model(value: str | dict[str, Any] | ModelSpec) -> ModelSpec:
    """Any accepted model input as a ModelSpec.

    Accepts a catalog name, a Hugging Face config.json dict (it has `architectures`), or a
    ModelSpec / its dict form (including a traced layer graph).
    """
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        return catalog_model(value)
    if isinstance(value, dict):
        if "architectures" in value or "model_type" in value:
            return model_from_hf_config(value)
        if "architecture" not in value:
            raise PlanningError(_shape_advice(value), field="model")
        try:
            return ModelSpec.model_validate(value)
        except ValidationError as exc:
            problems = describe_validation_error(exc, prefix="model")
            raise PlanningError("; ".join(problems), field="model") from None
    raise PlanningError(
        "model: give a catalog name, a Hugging Face config.json object, or a model spec", field="model"
    )
