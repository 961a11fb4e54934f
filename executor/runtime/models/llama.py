"""Llama-family decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

One implementation covers Llama 2/3/3.1, Mistral-style and Qwen2-style dense models (qkv bias);
they differ only in dimensions. Parameter count matches the planner's `planner.cost.model_costs`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from contract.model_config import ModelConfig
from executor.runtime.models.common import InitRule, ModelParts, OutputHead, blocks_in_order, sdpa_causal


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (no mean subtraction, no bias)."""

    def __init__(self, dim: int, *, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32: bf16 mean-of-squares loses too much precision at large widths.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for rotary position embeddings (rotate-half convention)."""

    def __init__(self, head_dim: int, *, max_len: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.max_len, self.theta = head_dim, max_len, theta
        # Not persistent: recomputed after materialisation, never checkpointed.
        self.register_buffer("cos", torch.empty(max_len, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, head_dim), persistent=False)
        if self.cos.device.type != "meta":
            self.reset_buffers()

    def reset_buffers(self) -> None:
        device = self.cos.device
        exponents = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        angles = torch.outer(torch.arange(self.max_len, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        with torch.no_grad():
            self.cos.copy_(angles.cos())
            self.sin.copy_(angles.sin())

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate `x` of shape [batch, heads, seq, head_dim]: its tokens sit at positions 0..seq-1,
        or at `positions` (int64 [seq]: a context-parallel rank's chunks of a longer sequence)."""
        if positions is None:
            cos, sin = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


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

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        out = self.attend(q, k, v, rope)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryEmbedding
    ) -> torch.Tensor:
        """Causal attention of the [batch, heads, seq, head_dim] projections (q and k rotated
        here). Context parallelism overrides it (`context_parallel.ContextParallelAttention`)."""
        return sdpa_causal(rope(q), rope(k), v)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(.))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.hidden_size, cfg.ffn_size)

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
        self.rope = RotaryEmbedding(cfg.head_dim, max_len=seq_len, theta=cfg.rope_theta)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.num_layers))
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

    def init_rule(self, name: str) -> InitRule:
        """How parameter `name` is initialised (GPT-2 / Llama recipe, scaled residual outputs)."""
        std = 0.02
        if name.endswith("norm.weight"):
            return InitRule("ones")
        if name.endswith(".bias"):
            return InitRule("zeros")
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            # Residual branch outputs: keep the residual stream's variance independent of depth.
            return InitRule("normal", std / math.sqrt(2 * self.cfg.num_layers))
        if name == "output.weight":
            return InitRule("normal", self.cfg.hidden_size**-0.5)
        return InitRule("normal", std)
