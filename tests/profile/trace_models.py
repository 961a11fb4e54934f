"""Model factories for `fsdp-planner trace` tests, written the way a user writes one: a function that
builds and returns an `nn.Module` (here the project's own Llama and a few deliberately odd ones)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.model_config import ModelConfig
from executor.runtime.models import Llama

DEBUG_DIMS: dict[str, Any] = {
    # llama-debug of the model catalog (planner/catalog/models.py).
    "name": "llama-debug",
    "architecture": "llama",
    "vocab_size": 2048,
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 8,
    "num_kv_heads": 4,
    "intermediate_size": 768,
    "max_seq_len": 2048,
}


def llama_debug(seq_len: int = 2048) -> nn.Module:
    """The catalog's llama-debug, built by the runtime's own Llama."""
    return Llama(ModelConfig(**DEBUG_DIMS), seq_len=seq_len)


def llama_from_hf_config(config: str) -> nn.Module:
    """The project's Llama from a Hugging Face `config.json` (Llama, Mistral or Qwen2), no transformers."""
    hf = json.loads(Path(config).read_text())
    cfg = ModelConfig(
        name=hf.get("_name_or_path", "hf-model"),
        architecture="llama",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads"),
        intermediate_size=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"],
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        qkv_bias=hf["architectures"][0] == "Qwen2ForCausalLM",
        rope_theta=hf.get("rope_theta", 10000.0),
        norm_eps=hf.get("rms_norm_eps", 1e-5),
    )
    return Llama(cfg, seq_len=cfg.max_seq_len)


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.norm(x))


class TwoWidths(nn.Module):
    """Blocks of two widths in one ModuleList: two block types."""

    def __init__(self, *, narrow: int, wide: int, each: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, narrow)
        narrow_blocks = [_Block(narrow) for _ in range(each)]
        wide_blocks = [_Block(wide) for _ in range(each)]
        self.blocks = nn.ModuleList([*narrow_blocks, nn.Linear(narrow, wide), *wide_blocks])
        self.head = nn.Linear(wide, 100, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def two_widths(narrow: int = 32, wide: int = 64, each: int = 3) -> nn.Module:
    return TwoWidths(narrow=narrow, wide=wide, each=each)


class Encoder(nn.Module):
    """torch's own TransformerEncoderLayer blocks: attention runs inside nn.MultiheadAttention."""

    def __init__(self, *, width: int, depth: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 8, 4 * width, dropout=0.0, batch_first=True)
            for _ in range(depth)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def encoder(width: int = 256, depth: int = 2, vocab: int = 1000) -> nn.Module:
    return Encoder(width=width, depth=depth, vocab=vocab)


def not_a_module() -> dict[str, int]:
    return {"hidden_size": 256}


def broken() -> nn.Module:
    raise RuntimeError("the checkpoint directory is missing")


def needs_width(width: int) -> nn.Module:
    """No ModuleList, so no repeated blocks: every child is a unit."""
    return nn.Sequential(nn.Embedding(100, width), nn.Linear(width, width))


def wrong_input() -> nn.Module:
    """A model whose forward does not take token ids."""
    return nn.Conv2d(3, 8, kernel_size=3)


def on_cpu() -> nn.Module:
    """Ignores the meta device it is built under."""
    return nn.Sequential(nn.Embedding(100, 16, device="cpu"), nn.Linear(16, 16, device="cpu"))
