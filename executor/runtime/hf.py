"""Hugging Face checkpoints of the built-in architectures: config.json checks and parameter names.

Supported (as `planner.catalog.models.model_from_hf_config` plans them):
  LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM   -> the runtime's `llama` model
  Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM,
  DeepseekV3ForCausalLM                                    -> the same, with query/key norms, experts,
                                                              latent attention (`executor.runtime.hf_moe`)
  GPT2LMHeadModel                                          -> the runtime's `gpt2` model

Names, runtime <- Hugging Face (Llama family; `model.` prefix optional):
  tok_embeddings.weight                 model.embed_tokens.weight
  layers.N.attention.wq/wk/wv.weight    model.layers.N.self_attn.q_proj/k_proj/v_proj.weight (+ .bias: Qwen2)
  layers.N.attention.wo.weight          model.layers.N.self_attn.o_proj.weight
  layers.N.feed_forward.w1/w3/w2.weight model.layers.N.mlp.gate_proj/up_proj/down_proj.weight
  layers.N.attention_norm.weight        model.layers.N.input_layernorm.weight
  layers.N.ffn_norm.weight              model.layers.N.post_attention_layernorm.weight
  norm.weight / output.weight           model.norm.weight / lm_head.weight (tied: the embedding)
No permutation of q/k: Hugging Face stores q_proj/k_proj for the rotate-half RoPE (its conversion
script permuted Meta's interleaved layout once), which is the convention `models.llama` computes.

GPT-2: the same names as the runtime's (`transformer.` prefix optional); Hugging Face's Conv1D
layers (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) store their weight as [in, out], the
transpose of `nn.Linear`'s, so those are read transposed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.model_config import ModelConfig
from executor.runtime import hf_moe
from executor.runtime.hf_moe import RopeRows
from executor.runtime.safetensors_io import WeightsError

LLAMA_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    **hf_moe.MOE_ARCHITECTURES,
}
GPT2_ARCHITECTURES = {"GPT2LMHeadModel": "gpt2"}
ARCHITECTURES = {**LLAMA_ARCHITECTURES, **GPT2_ARCHITECTURES}

IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
"""Buffers that old checkpoints carry and the runtime recomputes: skipped without a word."""
LOADED_BUFFERS = ("router.score_bias",)
"""The runtime's buffers a checkpoint holds too (DeepSeek-V3's router bias): loaded and exported."""

_LLAMA_BLOCK = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@dataclass(frozen=True, slots=True)
class Source:
    """Where a runtime parameter comes from in the checkpoint."""

    name: str
    """The tensor's name in the safetensors files."""
    transpose: bool = False
    """Stored as the transpose of the runtime's layout (GPT-2 Conv1D weights, experts' matrices)."""
    expert: int | None = None
    """The runtime parameter stacks the experts on dim 0 and this tensor is expert `expert`'s slice."""
    rope_rows: RopeRows | None = None
    """Rows whose rotary part the checkpoint interleaves (DeepSeek's `rope_interleave`)."""


def read_config(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise WeightsError(
            f"{path}: missing; --init-from needs a Hugging Face model directory (config.json + safetensors)"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    return config


def hf_architecture(config: dict[str, Any]) -> str:
    """The checkpoint's class name (`architectures[0]`, else from `model_type`)."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    by_type = {v: k for k, v in ARCHITECTURES.items()}
    return by_type.get(str(config.get("model_type")), f"<model_type {config.get('model_type')!r}>")


def check_config(
    config: dict[str, Any], model: ModelConfig, *, seq_len: int, where: str = "config.json"
) -> None:
    """Refuse a checkpoint whose config.json describes another model than the plan's, or uses a
    feature the runtime does not implement. Every mismatch is named in one message."""
    arch = hf_architecture(config)
    family = "gpt2" if arch in GPT2_ARCHITECTURES else "llama" if arch in LLAMA_ARCHITECTURES else None
    if arch in hf_moe.REFUSED_ARCHITECTURES:
        raise WeightsError(
            f"{where}: {arch} checkpoints are not supported by --init-from: the runtime's model lacks "
            f"{hf_moe.REFUSED_ARCHITECTURES[arch]}; train it from scratch, or with --model-factory"
        )
    if family is None:
        raise WeightsError(
            f"{where}: architecture {arch} is not supported; --init-from reads {', '.join(ARCHITECTURES)}"
        )
    if family != model.architecture:
        raise WeightsError(
            f"{where}: a {arch} checkpoint, but the plan's model {model.name!r} is a "
            f"{model.architecture!r} model; make the plan from this config.json (`fsdp-planner plan "
            "--hf-config config.json ...`)"
        )
    problems: list[str] = []
    expected = _llama_fields(config, arch) if family == "llama" else _gpt2_fields(config)
    expected |= hf_moe.expected_fields(config, arch)
    for field, (key, value) in expected.items():
        planned = hf_moe.planned(model, field)
        if not _same(value, planned):
            problems.append(f"{key} is {value!r}, the plan's model.{field} is {planned!r}")
    unsupported = _unsupported(config, arch, model, seq_len=seq_len)
    if unsupported and not problems:
        # Planning again from this config.json would not help: the runtime computes these otherwise.
        raise WeightsError(
            f"{where}: not supported by the runtime's model, which would compute it differently from "
            "how it was trained: " + "; ".join(unsupported)
        )
    problems += unsupported
    if problems:
        raise WeightsError(
            f"{where} does not match the plan's model {model.name!r}: " + "; ".join(problems) + ". Make "
            "the plan from this config.json (`fsdp-planner plan --hf-config config.json ...`) or pick "
            "the checkpoint the plan was made for"
        )


def _same(value: Any, planned: Any) -> bool:
    """config.json's value equals the plan's (floats to a relative 1e-6: JSON round trips)."""
    if isinstance(planned, float) and isinstance(value, int | float) and not isinstance(value, bool):
        return math.isclose(float(value), planned, rel_tol=1e-6)
    return type(value) is type(planned) and value == planned


def _llama_fields(config: dict[str, Any], arch: str) -> dict[str, tuple[str, Any]]:
    heads = config.get("num_attention_heads")
    theta = config.get("rope_theta")
    params = config.get("rope_parameters")  # transformers 5 moved rope_theta here
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    # Latent attention has no key/value heads and heads of its own widths (compared by hf_moe).
    latent = arch == "DeepseekV3ForCausalLM"
    return {
        "vocab_size": ("vocab_size", config.get("vocab_size")),
        "hidden_size": ("hidden_size", config.get("hidden_size")),
        "num_layers": ("num_hidden_layers", config.get("num_hidden_layers")),
        "num_heads": ("num_attention_heads", heads),
        **({} if latent else {
            "kv_heads": ("num_key_value_heads", config.get("num_key_value_heads") or heads),
            "head_dim": ("head_dim", config.get("head_dim") or _quotient(config.get("hidden_size"), heads)),
        }),
        "ffn_size": ("intermediate_size", config.get("intermediate_size")),
        "tie_word_embeddings": ("tie_word_embeddings", bool(config.get("tie_word_embeddings", False))),
        "qkv_bias": (
            "q/k/v bias" if arch == "Qwen2ForCausalLM" else "attention_bias",
            arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias", False)),
        ),
        "rope_theta": ("rope_theta", 10000.0 if theta is None else theta),
        "norm_eps": ("rms_norm_eps", config.get("rms_norm_eps", 1e-5)),
    }


def _quotient(hidden: Any, heads: Any) -> Any:
    """hidden_size / num_attention_heads, the heads' width when config.json names none (None if the
    two are not positive integers: the comparison then reports them)."""
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads))
    return hidden // heads if valid else None


def _gpt2_fields(config: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    hidden = config.get("n_embd")
    return {
        "vocab_size": ("vocab_size", config.get("vocab_size")),
        "hidden_size": ("n_embd", hidden),
        "num_layers": ("n_layer", config.get("n_layer")),
        "num_heads": ("n_head", config.get("n_head")),
        "ffn_size": ("n_inner", config.get("n_inner") or (4 * hidden if isinstance(hidden, int) else None)),
        "max_seq_len": ("n_positions", config.get("n_positions", 1024)),
        "tie_word_embeddings": ("tie_word_embeddings", bool(config.get("tie_word_embeddings", True))),
        "norm_eps": ("layer_norm_epsilon", config.get("layer_norm_epsilon", 1e-5)),
    }


def _unsupported(config: dict[str, Any], arch: str, model: ModelConfig, *, seq_len: int) -> list[str]:
    """Features of the checkpoint the runtime's model would silently compute differently."""
    problems = []
    if arch in GPT2_ARCHITECTURES:
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            problems.append(f"activation_function {act!r} (the runtime's GPT-2 uses the tanh GELU, gelu_new)")
        return problems
    act = config.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act {act!r} (the runtime's SwiGLU uses silu)")
    if arch == "LlamaForCausalLM" and config.get("attention_bias"):
        problems.append(
            "attention_bias true (the runtime's o_proj has no bias; only Qwen2-style q/k/v biases)"
        )
    if config.get("mlp_bias"):
        problems.append("mlp_bias true (the runtime's feed-forward has no biases)")
    scaling = config.get("rope_scaling")
    params = config.get("rope_parameters")
    if scaling is None and isinstance(params, dict):
        scaling = params if params.get("rope_type", "default") != "default" else None
    if isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type")) not in (
        None,
        "default",
    ):
        kind = scaling.get("rope_type") or scaling.get("type")
        problems.append(
            f"rope_scaling {kind!r} (the runtime computes unscaled RoPE: positions would be encoded "
            "differently from how the model was trained)"
        )
    problems += hf_moe.unsupported(config, arch)
    window = config.get("sliding_window")
    uses_window = config.get("use_sliding_window", arch in ("MistralForCausalLM", "MixtralForCausalLM"))
    if window and uses_window and seq_len > int(window):
        problems.append(
            f"sliding_window {window} shorter than the plan's seq_len {seq_len} (the runtime attends "
            "to the whole causal context)"
        )
    return problems


def sources(
    model: ModelConfig, names: list[str], available: set[str], *, config: dict[str, Any] | None = None
) -> dict[str, tuple[Source, ...]]:
    """The checkpoint tensors each runtime parameter in `names` is read from (one, or one per expert
    of a stacked parameter); `config` is the checkpoint's config.json (its family's names). Raises
    WeightsError naming the parameters the checkpoint lacks."""
    names_of = hf_moe.naming(model, config) if model.architecture == "llama" else None
    found: dict[str, tuple[Source, ...]] = {}
    missing: list[str] = []
    for name in names:
        options = _candidates(model, name, names_of)
        hit = next((o for o in options if all(s.name in available for s in o)), None)
        if hit is None:
            first = next((s.name for s in options[0] if s.name not in available), options[0][0].name)
            missing.append(f"{name} (as {first})")
        else:
            found[name] = hit
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise WeightsError(f"the checkpoint lacks {len(missing)} of the model's parameters: {shown}")
    return found


def _candidates(model: ModelConfig, name: str, names: hf_moe.Naming | None) -> list[tuple[Source, ...]]:
    """The ways a checkpoint may hold runtime parameter `name`, the usual first."""
    if model.architecture == "gpt2":
        transpose = name.endswith(_GPT2_CONV1D) and name.startswith("h.")
        if name == "lm_head.weight":
            out = [(Source("lm_head.weight"),)]
            if model.tie_word_embeddings:
                out += [(Source("transformer.wte.weight"),), (Source("wte.weight"),)]
            return out
        return [(Source("transformer." + name, transpose),), (Source(name, transpose),)]
    hf = llama_sources(model, name, names or hf_moe.Naming())
    if name == "output.weight":
        out = [hf]
        if model.tie_word_embeddings:
            out += [(Source("model.embed_tokens.weight"),), (Source("embed_tokens.weight"),)]
        return out
    bare = tuple(Source(s.name.removeprefix("model."), s.transpose, s.expert, s.rope_rows) for s in hf)
    return [hf, bare]


def llama_sources(model: ModelConfig, name: str, names: hf_moe.Naming) -> tuple[Source, ...]:
    """The Hugging Face tensors of a runtime Llama-family parameter (`layers.0.attention.wq.weight` ->
    `model.layers.0.self_attn.q_proj.weight`; a stacked expert parameter -> one per expert)."""
    if name == "tok_embeddings.weight":
        return (Source("model.embed_tokens.weight"),)
    if name == "norm.weight":
        return (Source("model.norm.weight"),)
    if name == "output.weight":
        return (Source("lm_head.weight"),)
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) >= 4:
        module, leaf = ".".join(parts[2:-1]), parts[-1]
        rows = hf_moe.rope_rows(model, module, names)
        family = hf_moe.block_names(model, module, leaf, parts[1], names)
        if family is not None:
            # The experts' matrices are stored [out, in], the transpose of their slice of the stack.
            return tuple(Source(n, expert is not None, expert, rows) for n, expert in family)
        if module in _LLAMA_BLOCK:
            feed_forward = _LLAMA_BLOCK[module].replace("mlp.", names.feed_forward + ".")
            return (Source(f"model.layers.{parts[1]}.{feed_forward}.{leaf}", rope_rows=rows),)
    raise WeightsError(f"no Hugging Face name for the runtime's Llama parameter {name!r}")


def export_names(
    model: ModelConfig, name: str, *, config: dict[str, Any] | None = None
) -> tuple[Source, ...]:
    """How runtime parameter `name` is written for Hugging Face: the tensors (one per expert of a
    stacked parameter), whether transposed, in the family of `config` (the original config.json),
    else of `hf_moe.export_architecture`."""
    if model.architecture == "gpt2":
        if name == "lm_head.weight":
            return (Source(name),)
        return (Source("transformer." + name, name.startswith("h.") and name.endswith(_GPT2_CONV1D)),)
    return llama_sources(model, name, hf_moe.naming(model, config))


def to_runtime(tensor: Any, src: Source, shape: tuple[int, ...], offset: tuple[int, ...]) -> Any:
    """The box (`shape` at `offset`) of a runtime parameter (or of its expert slice) in checkpoint
    tensor `tensor` as stored: transposed and rows reordered as `src` says, reading only the box's rows."""
    view = tensor.t() if src.transpose else tensor
    if src.rope_rows is not None:
        rows = src.rope_rows.order(view.shape[0])[offset[0] : offset[0] + shape[0]]
        view, offset = view.index_select(0, rows), (0, *offset[1:])
    return view[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))]


def to_checkpoint(tensor: Any, src: Source) -> Any:
    """Runtime parameter `tensor` (whole) as checkpoint tensor `src`: its expert's slice, rows back in
    the checkpoint's order, transposed as stored (the inverse of `to_runtime`)."""
    if src.expert is not None:
        tensor = tensor[src.expert]
    if src.rope_rows is not None:
        tensor = tensor.new_empty(tensor.shape).index_copy_(0, src.rope_rows.order(tensor.shape[0]), tensor)
    return tensor.t() if src.transpose else tensor


def export_config(model: ModelConfig, *, dtype: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config.json for the plan's model: `base` (the checkpoint's own config, which carries token
    ids and the like) with the dimensions set from the plan, or one written from scratch."""
    config = dict(base or {})
    if model.architecture == "gpt2":
        config.setdefault("architectures", ["GPT2LMHeadModel"])
        config.setdefault("model_type", "gpt2")
        config.setdefault("activation_function", "gelu_new")
        config.update(
            vocab_size=model.vocab_size,
            n_embd=model.hidden_size,
            n_layer=model.num_layers,
            n_head=model.num_heads,
            n_inner=model.ffn_size,
            n_positions=model.max_seq_len,
            layer_norm_epsilon=model.norm_eps,
            tie_word_embeddings=model.tie_word_embeddings,
        )
    else:
        family = None if base else hf_moe.export_architecture(model)
        if family is not None:
            config.update(hf_moe.export_fields(model, family))
        elif not base:
            qwen = model.qkv_bias
            config.update(
                architectures=["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
                model_type="qwen2" if qwen else "llama",
                hidden_act="silu",
                rope_scaling=None,
            )
            if not qwen:
                config.update(attention_bias=False, mlp_bias=False)
        config.update(
            vocab_size=model.vocab_size,
            hidden_size=model.hidden_size,
            intermediate_size=model.ffn_size,
            num_hidden_layers=model.num_layers,
            num_attention_heads=model.num_heads,
            num_key_value_heads=model.kv_heads,
            max_position_embeddings=config.get("max_position_embeddings", model.max_seq_len),
            rms_norm_eps=model.norm_eps,
            rope_theta=model.rope_theta,
            tie_word_embeddings=model.tie_word_embeddings,
        )
        if model.latent_attention is None:
            config.setdefault("head_dim", model.head_dim)
    config["torch_dtype"] = dtype
    return config
