"""The two halves of a llama-family block, priced apart: attention (grouped-query or multi-head latent)
and the feed-forward (dense SwiGLU or a mixture of experts). `planner.cost.model_costs` adds a block's
two halves into one `UnitCost`; one object per kind of block (a model with leading dense blocks, or
Llama 4 Maverick's interleave, has two kinds).

Each half counts per token what its norm, projections and elementwise ops hold, run and keep (the
fields mean what `UnitCost`'s of the same name mean). A mixture of experts' routed experts are kept
apart (`expert_shapes`, `routed_experts`, `experts_per_token`): the cost model runs them as grouped
GEMMs at the tokens each expert receives (planner/cost/gemm.py), not at the micro-batch's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from contract.model_config import LatentAttention, MoeConfig

LinearShapes = tuple[tuple[int, tuple[int, ...]], ...]
"""(in_features, (out_features, ...)) per group of linear layers reading one input, in forward order
(even positions column-parallel, odd row-parallel: `UnitCost.linear_shapes`)."""
_NO_LAYER: tuple[int, tuple[int, ...]] = (0, ())
"""A placeholder group of no layers: keeps the column/row alternation where two column-parallel
groups follow each other (a latent's down projection, then its up projection)."""


@dataclass(frozen=True, slots=True)
class BlockPart:
    """What one half of a block owns and does per token (summed field by field into a block)."""

    num_params: int
    matmul_params: int
    gemms: int
    attention_flops: float
    attention_flops_convention: float
    elementwise_elems: float
    kernels: int
    saved_elems: float
    compiled_saved_elems: float
    saved_fp32_elems: float
    op_saved_elems: float
    op_recompute_matmul_params: int
    attention_output_elems: float
    tensors: int
    replicated_params: int
    kv_elems: float = 0.0
    expert_params: int = 0
    """Of `num_params`, the routed experts' (FSDP shards them like the rest; expert parallelism, a later
    step, splits them apart)."""
    inactive_params: int = 0
    """Of `expert_params`, those a token does not run: the routed experts outside its top-k."""
    expert_matmul_params: int = 0
    """Of `matmul_params`, the routed experts' a token runs (top-k experts' weights)."""
    dispatch_elems: float = 0.0
    """Of `saved_elems`, the dispatch buffers: each token's rows gathered for its k experts and the
    experts' outputs before the combine."""
    expert_saved_elems: float = 0.0
    """Of `saved_elems`, the routed experts' own: their SwiGLU intermediates, the router's scores."""
    op_routing_elems: float = 0.0
    """Of `op_saved_elems`, the router's: its top-k values and indices, and its GEMM's output when
    the matmul alternation keeps it (computed for the whole sequence on every tensor-parallel rank)."""
    exchange_elems: float = 0.0
    """Expert parallelism's all-to-all outputs per token: the rows received for the rank's experts
    and the experts' outputs received back (k hidden-wide rows each). Op-level checkpointing keeps
    them (its recompute never re-runs communication) once ep > 1: not in `op_saved_elems`, which is
    the block without expert parallelism (`model_costs.expert_parallel_share` adds them)."""

    def __add__(self, other: BlockPart) -> BlockPart:
        return BlockPart(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True, slots=True)
class Attention:
    """The attention half: its part and its linear layers."""

    part: BlockPart
    linear_shapes: LinearShapes


@dataclass(frozen=True, slots=True)
class FeedForward:
    """The feed-forward half: its part, its linear layers, and a mixture's routed experts (one expert's
    linear layers, whole; how many experts; how many each token runs)."""

    part: BlockPart
    linear_shapes: LinearShapes
    expert_shapes: LinearShapes = ()
    routed_experts: int = 0
    experts_per_token: int = 0


def _attention_flops(seq_len: int, score_width: int, value_width: int) -> tuple[float, float]:
    # Per token and layer: QK^T and AV are 2 matmuls of 2 * seq * (heads x their width) FLOPs; causal
    # masking lets flash attention skip about half, which the convention (and MFU) ignores.
    convention = 2.0 * seq_len * (score_width + value_width)
    return convention / 2.0, convention


def grouped_query_attention(
    *, h: int, a: int, kv: int, head_dim: int, seq_len: int, qkv_bias: bool, qk_norm: bool
) -> Attention:
    """Llama attention: the input RMSNorm, q/k/v (`a`, `kv`, `kv` wide) and o projections, RoPE, flash
    attention, the residual add; with `qk_norm` an RMSNorm on each head's queries and keys (Qwen3)."""
    weights = h * a + 2 * h * kv + a * h
    bias = (a + 2 * kv) if qkv_bias else 0
    norm = 2 * head_dim if qk_norm else 0
    attn, convention = _attention_flops(seq_len, a, a)
    qk = a + kv
    part = BlockPart(
        num_params=weights + bias + h + norm,
        matmul_params=weights,
        gemms=4,
        attention_flops=attn,
        attention_flops_convention=convention,
        # The RMSNorm (~8 passes over h), RoPE on q and k, the residual add; each q/k norm ~8 passes.
        elementwise_elems=8 * h + 6 * qk + 3 * h + (8 * qk if qk_norm else 0),
        kernels=22 + (8 if qk_norm else 0),
        # The norm's input, normalized value and output; rotated q and k, v, the attention output
        # (the q/k norms add their normalized value and output, their fp32 inputs below).
        saved_elems=3 * h + 2 * a + 2 * kv + (2 * qk if qk_norm else 0),
        # Compiled: the block input, the norm output, rotated q and k, v, the attention output, the
        # output projection's result (q/k norms: their inputs, the projections' outputs).
        compiled_saved_elems=3 * h + 2 * a + 2 * kv + (qk if qk_norm else 0),
        saved_fp32_elems=h + (qk if qk_norm else 0),
        # The block input, q and v projections, the attention output.
        op_saved_elems=h + 2 * a + kv,
        op_recompute_matmul_params=h * kv + a * h,
        attention_output_elems=a,
        tensors=5 + (3 if qkv_bias else 0) + (2 if qk_norm else 0),
        replicated_params=h + norm,
        kv_elems=2 * kv,
    )
    return Attention(part, ((h, (a, kv, kv)), (a, (h,))))


def latent_attention(*, h: int, heads: int, latent: LatentAttention, seq_len: int) -> Attention:
    """Multi-head latent attention (DeepSeek-V2/V3): the input RMSNorm; queries through a `q_lora_rank`
    latent (its RMSNorm between the down and up projections) or projected directly; keys and values
    through a `kv_lora_rank` latent (its RMSNorm) beside one shared rotary key head; the up projection
    to every head's key (`qk_nope_head_dim`) and value; attention at qk_head_dim / v_head_dim widths;
    the output projection."""
    r_q, r_kv, rope = latent.q_lora_rank or 0, latent.kv_lora_rank, latent.qk_rope_head_dim
    q_width, v_width = heads * latent.qk_head_dim, heads * latent.v_head_dim
    kv_up = heads * (latent.qk_nope_head_dim + latent.v_head_dim)
    q_weights = h * r_q + r_q * q_width if r_q else h * q_width
    weights = q_weights + h * (r_kv + rope) + r_kv * kv_up + v_width * h
    norms = h + r_q + r_kv
    attn, convention = _attention_flops(seq_len, q_width, v_width)
    part = BlockPart(
        num_params=weights + norms,
        matmul_params=weights,
        gemms=5 if r_q else 4,
        attention_flops=attn,
        attention_flops_convention=convention,
        # Three RMSNorms, RoPE on the rotary parts, the key's rotary head copied to every head, the
        # residual add.
        elementwise_elems=8 * norms + 6 * 2 * heads * rope + 2 * q_width + 3 * h,
        kernels=34 if r_q else 28,
        # Each norm's input, normalized value and output; the latent and rotary key; q, k and v at
        # every head; the attention output.
        saved_elems=3 * norms + r_kv + rope + 2 * q_width + 2 * v_width,
        compiled_saved_elems=3 * h + r_q + r_kv + rope + 2 * q_width + 2 * v_width,
        saved_fp32_elems=norms,
        op_saved_elems=h + r_q + r_kv + rope + q_width + 2 * v_width,
        op_recompute_matmul_params=h * (r_kv + rope) + v_width * h,
        attention_output_elems=v_width,
        tensors=(5 if r_q else 4) + (3 if r_q else 2),
        replicated_params=norms,
        kv_elems=q_width + v_width,
    )
    # The down projections read the norm output together; each up projection reads its latent.
    direct = ((h, (q_width, r_kv + rope)),)
    queries = ((h, (r_q, r_kv + rope)), _NO_LAYER, (r_q, (q_width,))) if r_q else direct
    shapes = (*queries, _NO_LAYER, (r_kv, (kv_up,)), (v_width, (h,)))
    return Attention(part, shapes)


def dense_feed_forward(*, h: int, f: int) -> FeedForward:
    """The llama MLP: the RMSNorm, SwiGLU (w1, w3, w2 at hidden `f`), the residual add."""
    weights = 3 * h * f
    part = BlockPart(
        num_params=weights + h,
        matmul_params=weights,
        gemms=3,
        attention_flops=0.0,
        attention_flops_convention=0.0,
        elementwise_elems=8 * h + 3 * h + 5 * f,
        kernels=16,
        # The norm's input, normalized value and output; w1/w3 outputs, silu output, product.
        saved_elems=3 * h + 4 * f,
        # Compiled: the norm output, w1, w3 and their product.
        compiled_saved_elems=h + 3 * f,
        saved_fp32_elems=h,
        op_saved_elems=h + f,  # w1 output, w2 output
        op_recompute_matmul_params=h * f,
        attention_output_elems=0.0,
        tensors=4,
        replicated_params=h,
    )
    return FeedForward(part, ((h, (f, f)), (f, (h,))))


def moe_feed_forward(*, h: int, moe: MoeConfig, matmuls_before: int = 4) -> FeedForward:
    """A mixture of experts: the RMSNorm; the router (an h x E GEMM, softmax or sigmoid scores, top-k);
    each token's rows gathered to its k experts (the dispatch), each routed expert a SwiGLU of
    `expert_intermediate_size` run as grouped GEMMs, the results scattered back and summed with the
    scores as weights (the combine); the shared experts, a SwiGLU every token runs; the residual add.
    With `expert_bias` (gpt-oss) the router and the experts' projections carry biases.
    `matmuls_before` is the block's matmuls ahead of this half (its attention's): op-level
    checkpointing keeps every other matmul output of a block, counting from its first."""
    experts, k, fe = moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size
    shared = moe.num_shared_experts * moe.shared_size
    router = h * experts + (experts if moe.expert_bias else 0)
    per_expert = 3 * h * fe + ((2 * fe + h) if moe.expert_bias else 0)
    routed_rows = k * h
    # Counted on the runtime's block (tests/profile/test_moe_saved_tensors.py, exactly), in 16-bit
    # elements per token. The router keeps its scores (fp32: 2 each), its top-k indices (int64: 4) and
    # weights (fp32: 2), and eagerly their sum that renormalises them (fp32: 2 per token). The dispatch
    # keeps the rows gathered for the experts and the experts' outputs back in token order for the
    # weighted combine, two int64 indices per routed row (the gather's source, the combine's
    # destination) and, eagerly, the experts' outputs in expert order too and the weights cast to the
    # activations' dtype (1 per row); compiled, those two are not kept. With expert biases each row's
    # expert index (int64) is kept for their gradients.
    router_saved = 2 * experts + 6 * k
    renormalising_sum = 2  # eager only
    indices = 8 * k + (4 * k if moe.expert_bias else 0)
    dispatch = 3 * routed_rows + indices + k
    compiled_dispatch = 2 * routed_rows + indices
    # Op-level checkpointing (executor/runtime/activation_checkpoint.py `_op_sac_context`, counted
    # in tests/profile/test_moe_saved_tensors.py) keeps the router's top-k (fp32 values: 2 each,
    # int64 indices: 4) and of the matmuls (router; shared w1, w3, w2) every other one, the block's
    # odd ones; the grouped GEMMs are recomputed, and with them all three routed projections.
    # (output width, weights) of the half's matmuls in forward order: the router, shared w1, w3, w2.
    router_mm = (experts, h * experts)
    shared_mms = ((shared, h * shared), (shared, h * shared), (h, shared * h)) if shared else ()
    kept = [(matmuls_before + i) % 2 == 0 for i in range(1 + len(shared_mms))]  # the block's 1st, 3rd...
    op_routing = 6 * k + (router_mm[0] if kept[0] else 0)
    op_saved = op_routing + sum(width for (width, _), keep in zip(shared_mms, kept[1:], strict=True) if keep)
    op_recompute = 3 * k * h * fe + sum(
        weights for (_, weights), keep in zip((router_mm, *shared_mms), kept, strict=True) if not keep
    )
    part = BlockPart(
        num_params=router + experts * per_expert + 3 * h * shared + h,
        matmul_params=h * experts + k * 3 * h * fe + 3 * h * shared,
        gemms=1 + 3 + (3 if shared else 0),
        attention_flops=0.0,
        attention_flops_convention=0.0,
        # The norm, the residual add, scoring and top-k over the experts, the dispatch's gather and
        # the combine's scatter-add (each reads and writes k rows), SwiGLU on the routed and shared rows.
        elementwise_elems=11 * h + 4 * experts + 4 * routed_rows + 5 * k * fe + 5 * shared,
        kernels=16 + 14 + (6 if shared else 0),
        # The norm's three; the router's; the dispatch buffers; the routed rows' w1/w3 outputs, silu
        # and product; the shared experts' four (counted on the runtime's MoE block with saved-tensor
        # hooks, tests/profile/test_moe_saved.py).
        saved_elems=3 * h + router_saved + renormalising_sum + dispatch + 4 * k * fe + 4 * shared,
        compiled_saved_elems=h + router_saved + compiled_dispatch + 3 * k * fe + 3 * shared,
        saved_fp32_elems=h,
        op_saved_elems=op_saved,
        op_recompute_matmul_params=op_recompute,
        attention_output_elems=0.0,
        tensors=2 + (1 if moe.expert_bias else 0) + 3 + (2 if moe.expert_bias else 0) + (3 if shared else 0),
        replicated_params=h + router,  # the norm and the router, whole on every tensor-parallel rank
        expert_params=experts * per_expert,
        inactive_params=(experts - k) * per_expert,
        expert_matmul_params=k * 3 * h * fe,
        dispatch_elems=dispatch,
        expert_saved_elems=router_saved + renormalising_sum + 4 * k * fe,
        op_routing_elems=op_routing,
        exchange_elems=2 * routed_rows,
    )
    # The router reads the norm output with the shared experts' w1 and w3.
    dense = ((h, (experts, shared, shared)), (shared, (h,))) if shared else ((h, (experts,)),)
    return FeedForward(part, dense, ((h, (fe, fe)), (fe, (h,))), experts, k)
