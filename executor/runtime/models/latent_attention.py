"""Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank latents.

Per token: the query comes from the hidden state directly (`wq`) or through a normalised latent of
`q_lora_rank` (`wq_a`, `q_norm`, `wq_b`); `wkv_a` makes the key/value latent (`kv_lora_rank`, then
`kv_norm`) and one rotary key shared by every head (`qk_rope_head_dim`); `wkv_b` expands the latent
to each head's position-free key (`qk_nope_head_dim`) and value (`v_head_dim`). Each head's query
and key are [nope | rotated rope] (qk_head_dim wide), its value v_head_dim wide: scaled dot-product
attention takes values of another width than queries and keys (its math and memory-efficient kernels;
flash needs equal widths and is then not chosen), so no padding. Hugging Face names: q_a_proj,
q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.

Under tensor parallelism (`executor.runtime.tensor_parallel`) the heads are split: wq / wq_b and wkv_b
column-parallel, wo row-parallel; the down projections and their norms (wq_a, q_norm, wkv_a, kv_norm)
run replicated on the gathered sequence, as DTensors whose gradients sum over the ranks.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial

from contract.model_config import LatentAttention, ModelConfig
from executor.runtime.models.common import sdpa_causal
from executor.runtime.models.layers import RMSNorm, RotaryEmbedding


class LatentSelfAttention(nn.Module):
    """Causal multi-head latent attention of `cfg.num_heads` heads (the rope table is
    `qk_rope_head_dim` wide: `Llama` builds it so for a latent-attention model)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        mla: LatentAttention | None = cfg.latent_attention
        assert mla is not None, "LatentSelfAttention needs cfg.latent_attention"
        h, heads = cfg.hidden_size, cfg.num_heads
        self.nope, self.rope_dim, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_rank = mla.kv_lora_rank
        q_width = heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.wq = nn.Linear(h, q_width, bias=False)
        else:
            self.wq_a = nn.Linear(h, mla.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(mla.q_lora_rank, eps=cfg.norm_eps)
            self.wq_b = nn.Linear(mla.q_lora_rank, q_width, bias=False)
        self.q_lora = mla.q_lora_rank is not None
        self.wkv_a = nn.Linear(h, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(mla.kv_lora_rank, eps=cfg.norm_eps)
        self.wkv_b = nn.Linear(mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.wo = nn.Linear(heads * mla.v_head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.q_lora else self.wq(x)
        q = q.view(b, t, -1, self.nope + self.rope_dim).transpose(1, 2)  # [b, heads, t, qk_head_dim]
        heads = q.shape[1]
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rope = self.wkv_a(x).split([self.kv_rank, self.rope_dim], dim=-1)
        if isinstance(k_rope, DTensor):
            # Tensor parallelism: the latent path is replicated, each rank's heads read the rotary
            # key, so its gradient here is this rank's heads' share (summed over the ranks).
            k_rope = k_rope.to_local(grad_placements=[Partial()])
        kv = self.wkv_b(self.kv_norm(latent)).view(b, t, heads, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        # The rotary key is one head's, shared by all: rotate once, then broadcast.
        k_rope = rope(k_rope.unsqueeze(1)).expand(b, heads, t, self.rope_dim)
        q = torch.cat([q_nope, rope(q_rope)], dim=-1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        out = sdpa_causal(q, k, v)  # scale 1 / sqrt(qk_head_dim), as DeepSeek (without YaRN's mscale)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))
