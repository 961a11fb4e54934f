"""Tiny Hugging Face checkpoints written by the tests, and reference forwards that do not use the
runtime's model code.

`write_checkpoint` writes config.json + safetensors (one file, or shards + index) with the runtime's
own writer; the reader's tests also cross-check that writer against the `safetensors` package when
it is installed. `llama_logits` / `gpt2_logits` are plain-torch forwards written from the Hugging
Face modelling code's formulas (RMSNorm, rotate-half RoPE over [cos, cos] / [sin, sin] tables,
repeat_kv, explicit softmax attention, SwiGLU; GPT-2's Conv1D x @ W + b and tanh GELU), so a wrong
name map, a missing q/k permutation or a transposed weight in the runtime shows up as a logit
mismatch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from executor.runtime.safetensors_io import write_sharded

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "float32",
}
QWEN2_CONFIG: dict[str, Any] = {
    **{k: v for k, v in LLAMA_CONFIG.items() if k not in ("attention_bias", "mlp_bias")},
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 255,  # odd: FSDP's dim-0 shards of the embedding are uneven on 2 ranks
    "intermediate_size": 96,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "use_sliding_window": False,
}
MISTRAL_CONFIG: dict[str, Any] = {
    **{k: v for k, v in LLAMA_CONFIG.items() if k not in ("attention_bias", "mlp_bias")},
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    # Heads of their own width, as Mistral-NeMo's (32 x 128 at hidden 5120): q and o are 4 x 24 = 96 wide.
    "head_dim": 24,
    "sliding_window": None,
}
GPT2_CONFIG: dict[str, Any] = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 256,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": None,
    "n_positions": 64,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}

# Runtime name -> Hugging Face name, written out here independently of executor.runtime.hf.
_LLAMA_BLOCK = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def runtime_to_hf(config: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Every runtime parameter (a tied weight once) -> (HF tensor name, stored transposed)."""
    if config["model_type"] == "gpt2":
        names = {
            "wte.weight": ("transformer.wte.weight", False),
            "wpe.weight": ("transformer.wpe.weight", False),
        }
        for i in range(config["n_layer"]):
            for leaf in ("ln_1", "ln_2"):
                for kind in ("weight", "bias"):
                    names[f"h.{i}.{leaf}.{kind}"] = (f"transformer.h.{i}.{leaf}.{kind}", False)
            for mod in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                names[f"h.{i}.{mod}.weight"] = (f"transformer.h.{i}.{mod}.weight", True)
                names[f"h.{i}.{mod}.bias"] = (f"transformer.h.{i}.{mod}.bias", False)
        names["ln_f.weight"] = ("transformer.ln_f.weight", False)
        names["ln_f.bias"] = ("transformer.ln_f.bias", False)
        if not config["tie_word_embeddings"]:
            names["lm_head.weight"] = ("lm_head.weight", False)
        return names
    names = {"tok_embeddings.weight": ("model.embed_tokens.weight", False)}
    bias = config["model_type"] == "qwen2"
    for i in range(config["num_hidden_layers"]):
        for ours, theirs in _LLAMA_BLOCK.items():
            names[f"layers.{i}.{ours}.weight"] = (f"model.layers.{i}.{theirs}.weight", False)
            if bias and ours in ("attention.wq", "attention.wk", "attention.wv"):
                names[f"layers.{i}.{ours}.bias"] = (f"model.layers.{i}.{theirs}.bias", False)
    names["norm.weight"] = ("model.norm.weight", False)
    if not config["tie_word_embeddings"]:
        names["output.weight"] = ("lm_head.weight", False)
    return names


def random_weights(
    config: dict[str, Any], *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """HF-named random weights for `config`: large enough (std 0.2, norms around 1) that every
    tensor visibly moves the logits."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = 0.2) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def around_one(n: int) -> torch.Tensor:
        return (1 + 0.2 * torch.randn(n, generator=g)).to(dtype)

    t: dict[str, torch.Tensor] = {}
    if config["model_type"] == "gpt2":
        h, v = config["n_embd"], config["vocab_size"]
        ffn = config["n_inner"] or 4 * h
        t["transformer.wte.weight"] = normal(v, h)
        t["transformer.wpe.weight"] = normal(config["n_positions"], h, std=0.05)
        for i in range(config["n_layer"]):
            p = f"transformer.h.{i}."
            t[p + "ln_1.weight"], t[p + "ln_1.bias"] = around_one(h), normal(h, std=0.05)
            t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = normal(h, 3 * h), normal(3 * h, std=0.05)
            t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = normal(h, h), normal(h, std=0.05)
            t[p + "ln_2.weight"], t[p + "ln_2.bias"] = around_one(h), normal(h, std=0.05)
            t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = normal(h, ffn), normal(ffn, std=0.05)
            t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = normal(ffn, h), normal(h, std=0.05)
        t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = around_one(h), normal(h, std=0.05)
        if not config["tie_word_embeddings"]:
            t["lm_head.weight"] = normal(v, h)
        return t
    h, v, ffn = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    a = config["num_attention_heads"] * d
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    bias = config["model_type"] == "qwen2"
    t["model.embed_tokens.weight"] = normal(v, h, std=1.0)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = around_one(h)
        t[p + "self_attn.q_proj.weight"] = normal(a, h)
        t[p + "self_attn.k_proj.weight"] = normal(kv * d, h)
        t[p + "self_attn.v_proj.weight"] = normal(kv * d, h)
        t[p + "self_attn.o_proj.weight"] = normal(h, a)
        if bias:
            t[p + "self_attn.q_proj.bias"] = normal(a)
            t[p + "self_attn.k_proj.bias"] = normal(kv * d)
            t[p + "self_attn.v_proj.bias"] = normal(kv * d)
        t[p + "post_attention_layernorm.weight"] = around_one(h)
        t[p + "mlp.gate_proj.weight"] = normal(ffn, h)
        t[p + "mlp.up_proj.weight"] = normal(ffn, h)
        t[p + "mlp.down_proj.weight"] = normal(h, ffn)
    t["model.norm.weight"] = around_one(h)
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = normal(v, h)
    return t


def write_checkpoint(
    directory: Path,
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    *,
    max_shard_bytes: int | None = None,
) -> Path:
    """config.json + model.safetensors, or shards of at most `max_shard_bytes` + the index."""
    directory.mkdir(parents=True, exist_ok=True)
    dtype = next(iter(tensors.values())).dtype
    (directory / "config.json").write_text(
        json.dumps({**config, "torch_dtype": str(dtype).removeprefix("torch.")}, indent=1)
    )
    write_sharded(directory, tensors, max_shard_bytes=max_shard_bytes or 2**62)
    return directory


# --- reference forwards (Hugging Face formulas, plain torch, float64 for a sharp reference) --------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[b, heads, t, d] each; explicit scores, mask and softmax."""
    t = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def llama_logits(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    """Logits [b, t, vocab] (float64) of a Llama / Mistral / Qwen2 checkpoint."""
    w = {k: v.double() for k, v in tensors.items()}
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    h = config["hidden_size"]
    d = config.get("head_dim") or h // heads
    eps = config["rms_norm_eps"]
    b, t = tokens.shape
    inv_freq = 1.0 / (config["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."

        def proj(name: str, inp: torch.Tensor, p: str = p) -> torch.Tensor:
            out = inp @ w[p + name + ".weight"].T
            bias = w.get(p + name + ".bias")
            return out if bias is None else out + bias

        y = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = proj("self_attn.q_proj", y).view(b, t, heads, d).transpose(1, 2)
        k = proj("self_attn.k_proj", y).view(b, t, kv, d).transpose(1, 2)
        v = proj("self_attn.v_proj", y).view(b, t, kv, d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = heads // kv  # repeat_kv: query head j uses key/value head j // rep
        k = k[:, :, None].expand(b, kv, rep, t, d).reshape(b, heads, t, d)
        v = v[:, :, None].expand(b, kv, rep, t, d).reshape(b, heads, t, d)
        attn = _causal_attention(q, k, v).transpose(1, 2).reshape(b, t, heads * d)
        x = x + proj("self_attn.o_proj", attn)
        y = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + proj("mlp.down_proj", F.silu(proj("mlp.gate_proj", y)) * proj("mlp.up_proj", y))
    x = _rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def gpt2_logits(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    """Logits [b, t, vocab] (float64) of a GPT-2 checkpoint (Conv1D weights are [in, out])."""
    w = {k.removeprefix("transformer."): v.double() for k, v in tensors.items()}
    h, heads, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    d = h // heads
    b, t = tokens.shape

    def conv1d(name: str, x: torch.Tensor) -> torch.Tensor:
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def ln(name: str, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (h,), w[name + ".weight"], w[name + ".bias"], eps)

    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        q, k, v = conv1d(p + "attn.c_attn", ln(p + "ln_1", x)).split(h, dim=-1)
        q, k, v = (z.view(b, t, heads, d).transpose(1, 2) for z in (q, k, v))
        attn = _causal_attention(q, k, v).transpose(1, 2).reshape(b, t, h)
        x = x + conv1d(p + "attn.c_proj", attn)
        y = conv1d(p + "mlp.c_fc", ln(p + "ln_2", x))
        gelu = 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y.pow(3))))
        x = x + conv1d(p + "mlp.c_proj", gelu)
    x = ln("ln_f", x)
    head = w["wte.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def reference_logits(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    fn = gpt2_logits if config["model_type"] == "gpt2" else llama_logits
    return fn(config, tensors, tokens)


def reference_loss(config: dict[str, Any], tensors: dict[str, torch.Tensor], batch: torch.Tensor) -> float:
    """Mean next-token cross-entropy of `batch` [b, t + 1] (inputs batch[:, :-1], targets batch[:, 1:])."""
    logits = reference_logits(config, tensors, batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()


def plan_model(config: dict[str, Any], name: str = "tiny") -> dict[str, Any]:
    """The plan's model section for `config`, as the planner reads a config.json."""
    from planner.catalog.models import resolve_model

    spec = resolve_model(config).model_dump(mode="json")
    spec["name"] = name
    return spec
