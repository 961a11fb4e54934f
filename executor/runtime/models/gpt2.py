"""GPT-2: learned positions, pre-LayerNorm blocks, GELU MLP, output head tied to the embedding.

Parameter count matches the planner's `planner.cost.model_costs` (biases and LayerNorms included).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from contract.model_config import ModelConfig
from executor.runtime.models.common import InitRule, ModelParts, OutputHead, blocks_in_order, sdpa_causal


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with a fused qkv projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        out = sdpa_causal(q, k, v)
        return self.c_proj(out.transpose(1, 2).reshape(b, t, h))


class MLP(nn.Module):
    """c_proj(gelu(c_fc x)) with GPT-2's tanh GELU."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, ffn)
        self.c_proj = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm block."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.ffn_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Token + position embeddings, blocks, final LayerNorm, head (tied unless the plan says not);
    returns logits, or with `targets` the mean cross-entropy computed in `loss_chunks` token slices.
    A pipeline stage is this model with parts removed, as for `Llama`."""

    def __init__(self, cfg: ModelConfig, *, seq_len: int) -> None:
        super().__init__()
        del seq_len  # positions come from the learned table of max_seq_len entries
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.hidden_size)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = OutputHead(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, loss_chunks: int = 1
    ) -> torch.Tensor:
        x = tokens
        if self.wte is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.wte(tokens) + self.wpe(positions)
        for block in blocks_in_order(self.h):
            x = block(x)
        if self.lm_head is None:
            return x
        return self.lm_head(self.ln_f(x), targets, chunks=loss_chunks)

    def parallel_parts(self) -> ModelParts:
        # A tied head shares its weight with wte: both must live in one FSDP unit (the root). A
        # pipeline stage is never tied (pipeline.py) and may lack the inputs or the outputs.
        tied = self.cfg.tie_word_embeddings and self.wte is not None and self.lm_head is not None
        inputs = [self.wpe] if tied else [self.wte, self.wpe]
        return ModelParts(
            blocks=blocks_in_order(self.h),
            inputs=[m for m in inputs if m is not None],
            outputs=[m for m in (self.ln_f, self.lm_head) if m is not None and not tied],
        )

    def reset_buffers(self) -> None:
        pass

    def init_rule(self, name: str) -> InitRule:
        if ".ln_" in name or name.startswith("ln_f."):
            return InitRule("ones" if name.endswith("weight") else "zeros")
        if name.endswith(".bias"):
            return InitRule("zeros")
        if name.endswith("c_proj.weight"):
            return InitRule("normal", 0.02 / math.sqrt(2 * self.cfg.num_layers))
        if name == "wpe.weight":
            return InitRule("normal", 0.01)
        return InitRule("normal", 0.02)
