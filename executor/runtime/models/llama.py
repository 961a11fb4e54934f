"""Llama-family decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

One implementation covers Llama 2/3/3.1, Mistral-style and Qwen2-style dense models (qkv bias),
Qwen3-style query/key norms (`qk_norm`), and the mixture-of-experts families: blocks whose
feed-forward routes tokens to experts (`moe`, `executor.runtime.models.moe`) and multi-head latent
attention (`latent_attention`, `executor.runtime.models.latent_attention`). Parameter count matches
the planner's `planner.cost.model_costs`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from contract.model_config import ModelConfig
from executor.runtime.models.common import InitRule, ModelParts, OutputHead, blocks_in_order, sdpa_causal
from executor.runtime.models.latent_attention import LatentSelfAttention
from executor.runtime.models.layers import FeedForward, RMSNorm, RotaryEmbedding
from executor.runtime.models.moe import MoEFeedForward, moe_layers

__all__ = ["Attention", "FeedForward", "Llama", "RMSNorm", "RotaryEmbedding", "TransformerBlock"]


class Attention(nn.Module):
    """Causal self-attention with grouped key/value heads.

    Heads are counted from the projections' output width, not the config: under tensor parallelism
    (column-parallel wq/wk/wv) a rank's projections hold num_heads / tp and num_kv_heads / tp heads.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        # q and the attention output are num_heads x head_dim wide: the hidden size unless the config's
        # heads have a width of their own (`head_size`, e.g. Mistral-NeMo's 32 x 128 at hidden 5120).
        h, a, kv = cfg.hidden_size, cfg.attention_width, cfg.kv_heads * cfg.head_dim
        self.wq = nn.Linear(h, a, bias=cfg.qkv_bias)
        self.wk = nn.Linear(h, kv, bias=cfg.qkv_bias)
        self.wv = nn.Linear(h, kv, bias=cfg.qkv_bias)
        self.wo = nn.Linear(a, h, bias=False)
        if cfg.qk_norm:
            # One head_dim-wide weight each, shared by the heads (Qwen3).
            self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # before the rotation (in `attend`)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        out = self.attend(q, k, v, rope)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryEmbedding
    ) -> torch.Tensor:
        """Causal attention of the [batch, heads, seq, head_dim] projections (q and k rotated
        here). Context parallelism overrides it (`context_parallel.ContextParallelAttention`)."""
        return sdpa_causal(rope(q), rope(k), v)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(.)). Block `index` (from 0) of a model
    with `moe` routes its feed-forward to experts when `cfg.moe.is_moe_layer(index)`."""

    def __init__(self, cfg: ModelConfig, *, index: int = 0) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attention = LatentSelfAttention(cfg) if cfg.latent_attention else Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.feed_forward: nn.Module = (
            MoEFeedForward(cfg.hidden_size, cfg.moe)
            if cfg.moe is not None and cfg.moe.is_moe_layer(index)
            else FeedForward(cfg.hidden_size, cfg.ffn_size)
        )

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token embeddings, `num_layers` blocks, final norm and output head; returns logits, or with
    `targets` the mean cross-entropy computed in `loss_chunks` token slices.

    A pipeline stage (`executor.runtime.pipeline`) is this model with some parts removed: without
    embeddings it takes hidden states, without the head (norm and output) it returns them."""

    def __init__(self, cfg: ModelConfig, *, seq_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # Latent attention rotates only each head's rope part (qk_rope_head_dim wide).
        rope_dim = cfg.latent_attention.qk_rope_head_dim if cfg.latent_attention else cfg.head_dim
        self.rope = RotaryEmbedding(rope_dim, max_len=seq_len, theta=cfg.rope_theta)
        self.layers = nn.ModuleList(TransformerBlock(cfg, index=i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.output = OutputHead(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, loss_chunks: int = 1
    ) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in blocks_in_order(self.layers):
            h = layer(h, self.rope)
        if self.output is None:
            return h
        return self.output(self.norm(h), targets, chunks=loss_chunks)

    def parallel_parts(self) -> ModelParts:
        # A tied weight sits in one unit (the root); a pipeline stage is never tied (pipeline.py).
        tied = self.cfg.tie_word_embeddings and self.tok_embeddings is not None and self.output is not None
        return ModelParts(
            blocks=blocks_in_order(self.layers),
            inputs=[m for m in (self.tok_embeddings,) if m is not None and not tied],
            outputs=[m for m in (self.norm, self.output) if m is not None and not tied],
        )

    def reset_buffers(self) -> None:
        self.rope.reset_buffers()
        for layer in moe_layers(self):
            layer.router.reset_buffers()

    def init_rule(self, name: str) -> InitRule:
        """How parameter `name` is initialised (GPT-2 / Llama recipe, scaled residual outputs)."""
        std = 0.02
        if name.endswith("norm.weight"):
            return InitRule("ones")
        if name.endswith((".bias", "experts.b1", "experts.b2", "experts.b3")):
            return InitRule("zeros")
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight", "shared.w2.weight", "experts.w2")):
            # Residual branch outputs: keep the residual stream's variance independent of depth.
            return InitRule("normal", std / math.sqrt(2 * self.cfg.num_layers))
        if name == "output.weight":
            return InitRule("normal", self.cfg.hidden_size**-0.5)
        return InitRule("normal", std)
