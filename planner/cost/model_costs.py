"""A model as the cost model sees it: units in forward order with parameters, FLOPs and activations.

Every architecture (built-in dims or a traced layer graph) is reduced to the same shape: an input
unit (embeddings), repeated blocks, and an output unit (final norm + head + loss), so that the rest
of the cost model never needs to know which architecture it prices.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from contract.float8 import float8_converts
from planner.cost.block_parts import (
    Attention,
    FeedForward,
    dense_feed_forward,
    grouped_query_attention,
    latent_attention,
    moe_feed_forward,
)
from planner.specs import LayerUnit, ModelSpec


@dataclass(frozen=True, slots=True)
class UnitCost:
    """Per-token costs of one module (an embedding, a block, or the head)."""

    name: str
    num_params: int
    """Parameters this unit owns (what FSDP shards and all-gathers)."""
    matmul_params: int
    """Weights used as matmul operands per token: 2 forward FLOPs each."""
    gemms: int
    """Matmul kernels per forward (each pays a fixed launch/tail cost)."""
    attention_flops: float
    """Forward attention FLOPs per token at the given sequence length, as executed (causal)."""
    attention_flops_convention: float
    """The same by the PaLM/torchtitan convention (not halved for causality), for MFU."""
    elementwise_elems: float
    """Elements read+written per token by non-matmul ops in eager forward (norms, RoPE, activations)."""
    kernels: int
    """Kernel launches per forward in eager mode."""
    saved_elems: float
    """Activation elements saved for backward per token without checkpointing."""
    op_saved_elems: float
    """Elements saved per token under op-level selective checkpointing."""
    op_recompute_matmul_params: int
    """Matmul weights re-run in backward under op-level selective checkpointing."""
    input_elems: float
    """Elements of the block's input per token (what full checkpointing keeps)."""
    compiled_saved_elems: float | None = None
    """Activation elements saved per token without checkpointing when the block is compiled as a
    plain module (torchtitan and torchtune compile each block, litgpt the whole model over FSDP2's
    gathered parameters): what inductor's min-cut partitioner keeps, which recomputes cheap
    elementwise results (a norm's normalised value, an activation's output) from what it keeps
    instead of saving them (None: `saved_elems`). Counted on the runtime's blocks under torch.compile
    from the partitioned forward graph's saved outputs (tests/profile/test_compiled_saved.py). This
    project's SimpleFSDP graphs, which gather the parameters inside the graph, stay priced with
    `saved_elems`: their measured peaks (tests/executor/test_memory_fidelity.py on CPU, the H200 runs
    of the corpus) sit 5-13% above what the smaller set predicts, for a reason not yet traced."""
    saved_fp32_elems: float = 0.0
    """Of `saved_elems`, those eager autograd keeps in fp32 whatever the compute dtype: each RMSNorm
    normalises an fp32 copy of its input and keeps it (in bf16 that is 4 bytes an element, not 2;
    measured with saved-tensor hooks, tests/profile/test_trace.py). Inductor's partitioner keeps the
    bf16 input and recomputes the cast instead, so compiled plans do not pay it."""
    attention_output_elems: float = 0.0
    """Elements of the attention output per token (what compiled whole-block checkpointing also keeps)."""
    tensors: int = 1
    """Parameter tensors (compiled SimpleFSDP gathers and reduces each one on its own unless bucketed)."""
    is_block: bool = True
    replicated_params: int = 0
    """Of `num_params`, those every tensor-parallel rank holds whole (norm weights)."""
    tp_collectives: int = 0
    """Collectives per forward under tensor parallelism with sequence parallelism (0: the unit
    does not support tensor parallelism): a llama block all-gathers the sequence before attention
    and the MLP and reduce-scatters after each; backward runs the mirror images."""
    tp_collective_elems: float = 0.0
    """Elements per token those collectives move in forward (whole-tensor size, as priced)."""
    gathered_elems: float = 0.0
    """Of `tp_collective_elems`, those all-gathered onto the whole sequence before column-parallel
    matmuls (a llama block: both norm outputs; the rest are reduce-scattered after row-parallel
    ones). The matmuls keep their gathered input for backward (torch's ColwiseParallel saves what
    it multiplies, unlike Megatron, which re-gathers in backward), so a tensor-parallel share divides
    the rest of `saved_elems` by tp, never these (measured with saved-tensor hooks on the runtime's
    tensor-parallel block, tests/executor/test_tensor_parallel_memory.py)."""
    linear_shapes: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """The unit's linear layers as (in_features, (out_features, ...)): the layers that read the same
    input together (llama's q, k, v), whole (not per tensor-parallel rank): what a Float8 recipe's
    filter decides on (contract/float8.py). In forward order, which under tensor parallelism
    alternates column-parallel layers (even positions: they read the sequence gathered whole) and
    row-parallel ones (odd: their output is reduce-scattered, its gradient gathered whole in
    backward). Empty: none that Float8 training converts (embeddings, the head, traced units)."""
    linear_share: int = 1
    """The tensor-parallel degree the unit's matmuls are split over (its share of `linear_shapes`)."""
    kv_elems: float = 0.0
    """Key and value elements per token (attention blocks): what context parallelism all-gathers
    over its group in forward (and reduce-scatters as gradients in backward)."""
    expert_shapes: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """A mixture of experts' block: one routed expert's linear layers, whole, as `linear_shapes` (its
    SwiGLU: w1 and w3, then w2; tensor parallelism splits them as a dense MLP's). They run as grouped
    GEMMs at the rows each expert receives (planner/cost/gemm.py), not in `linear_shapes`."""
    routed_experts: int = 0
    """Routed experts of a mixture of experts' block (0: a dense unit)."""
    experts_per_token: int = 0
    """Routed experts each token runs (the router's top-k)."""
    expert_matmul_params: int = 0
    """Of `matmul_params`, the routed experts' each token runs (k experts' weights)."""
    expert_params: int = 0
    """Of `num_params`, the routed experts' (all of them)."""
    inactive_params: int = 0
    """Of `expert_params`, those a token does not run (the experts outside its top-k): left out of
    the active count that FLOPs and MFU use."""
    dispatch_elems: float = 0.0
    """Of `saved_elems`, a mixture of experts' dispatch buffers per token: the rows gathered for each
    token's k experts, the experts' outputs (in expert order, and in token order for the combine) and
    the routing indices. Under tensor parallelism they stay whole on every rank, like
    `gathered_elems`: the experts read the sequence gathered whole, and their outputs are partial
    sums until the reduce-scatter after the combine."""
    expert_saved_elems: float = 0.0
    """Of `saved_elems`, the routed experts' own activations per token: their SwiGLU intermediates
    (4 x top-k x expert hidden) and the router's scores."""
    op_routing_elems: float = 0.0
    """Of `op_saved_elems`, a mixture of experts' router's: its top-k values and indices, and its
    GEMM's output where op-level checkpointing's matmul alternation keeps it. Whole on every
    tensor-parallel rank (each routes the whole sequence), and the routed experts' share of what
    op-level checkpointing keeps (planner/cost/expert_memory.py)."""
    exchange_elems: float = 0.0
    """A mixture of experts' expert-parallel all-to-all outputs per token (the rows received for
    the rank's experts, the experts' outputs received back: 2 x top-k x hidden), which op-level
    checkpointing keeps so that backward never re-runs them: `expert_parallel_share` adds them to
    `op_saved_elems` once ep > 1. Whole on every tensor-parallel rank, like `dispatch_elems`."""


@dataclass(frozen=True, slots=True)
class Float8Share:
    """What a Float8 recipe converts of one unit, per rank."""

    matmul_fraction: float
    """Of the unit's matmul FLOPs, the share that runs as float8 GEMMs."""
    cast_elems: float
    """Elements cast to float8 per token (forward input, backward output gradient, and their
    transposed copies for the weight gradient), per rank."""
    weight_elems: float
    """Weight elements cast to float8 per micro-batch (forward, and transposed for backward), per rank."""
    params: float
    """Parameters of the converted layers, per rank (what a float8 all-gather moves at one byte)."""


@functools.lru_cache(maxsize=1024)
def float8_share(
    unit: UnitCost, recipe: str, *, compiled: bool = False, whole_sequence_casts: bool = False
) -> Float8Share:
    """The part of `unit` that `recipe` trains in float8 (nothing for `none`). Each converted layer
    casts its input (forward, and again transposed for the weight gradient) and its output gradient
    (and that transposed); compiled, layers reading the same input share its casts (inductor
    computes the same cast once), eager each layer casts it anew.

    Under tensor parallelism a rank casts its share of each tensor, but with `whole_sequence_casts`
    the tensors gathered onto the whole sequence are cast whole on every rank: the column-parallel
    layers' inputs (gathered in forward) and the row-parallel layers' output gradients (gathered in
    backward). That is how torchao's Float8 linears run under torch's tensor-parallel styles; only
    its float8 styles (torchtitan's tensorwise recipe) cast each rank's shard before the gather."""
    # The routed experts' grouped GEMMs stay in bf16 (no trainer here converts them, though torchao has
    # grouped kernels for some recipes: contract/float8.py's GROUPED_GEMM_KERNELS; the plan warns):
    # they count in the whole, not in the converted share.
    experts = unit.experts_per_token * sum(i * o for i, outs in unit.expert_shapes for o in outs)
    total = sum(i * o for i, outs in unit.linear_shapes for o in outs) + experts
    split = unit.linear_share
    params = 0
    cast = 0.0
    for position, (i, outs) in enumerate(unit.linear_shapes):
        converted = [o for o in outs if float8_converts(recipe, i, o)]
        if not converted:
            continue
        params += i * sum(converted)
        column_parallel = position % 2 == 0
        inputs = i if compiled else i * len(converted)
        gradients = sum(converted)
        if whole_sequence_casts and split > 1:
            # Counted in whole elements, divided by `split` below: the gathered ones stay whole.
            inputs *= split if column_parallel else 1
            gradients *= 1 if column_parallel else split
        cast += inputs + gradients
    if not params or not total:
        return Float8Share(0.0, 0.0, 0.0, 0.0)
    return Float8Share(
        matmul_fraction=params / total,
        cast_elems=2.0 * cast / split,
        weight_elems=2.0 * params / split,
        params=params / split,
    )


@dataclass(frozen=True, slots=True)
class ModelCosts:
    """The whole model at one sequence length."""

    embedding: UnitCost
    blocks: tuple[UnitCost, ...]
    head: UnitCost
    num_params: int
    num_params_embedding: int
    vocab_size: int
    seq_len: int
    flops_params: int
    """N of the 6N convention: every parameter except input embeddings (a tied head counts)."""
    tensor_parallel: int = 1
    """1: the whole model; else one rank's share of a tensor-parallel group
    (`tensor_parallel_share`): units and vocabulary are per rank, `num_params` the whole model's."""
    expert_parallel: int = 1
    """1: every routed expert; else one rank's share of an expert-parallel group
    (`expert_parallel_share`): its MoE blocks hold num_experts / ep routed experts."""
    share_params: int = 0
    """With tensor_parallel > 1: the parameters one rank holds (summed once, the search reads it
    thousands of times)."""
    context_parallel: int = 1
    """1: every rank sees whole sequences; else the rank's share of a context-parallel group
    (`context_parallel_share`): per-token costs are those of the rank's own tokens, and each block
    keeps the keys and values gathered from the other cp ranks for its backward."""

    active_params: int | None = None
    """Parameters a token runs (a mixture of experts' top-k routed experts, not all of them; tied
    weights once); None: `num_params` (a dense model)."""

    pipeline_stage: bool = False
    """True: one pipeline rank's stages (`pipeline_rank_share`): its blocks, the embeddings only on
    the rank holding the first stage, the head and vocabulary only on the one holding the last;
    `share_params` is what the rank holds, `num_params` the whole model's."""

    @property
    def rank_params(self) -> int:
        """Parameters one rank holds: its tensor-parallel share of its pipeline stages (all of them
        when tp and pp are 1)."""
        split = self.tensor_parallel > 1 or self.pipeline_stage or self.expert_parallel > 1
        return self.share_params if split else self.num_params

    @property
    def has_routed_experts(self) -> bool:
        """A mixture of experts: some block runs routed experts."""
        return any(block.routed_experts for block in self.blocks)

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token, 6N + 12LHQT (the PaLM / torchtitan / nanoGPT convention)."""
        attention = sum(3.0 * u.attention_flops_convention for u in self.blocks)
        return 6.0 * self.flops_params + attention


def model_costs(spec: ModelSpec, seq_len: int) -> ModelCosts:
    """Decompose a model into priced units at a sequence length."""
    if spec.architecture == "layer_graph":
        return _layer_graph_costs(spec, seq_len)
    if spec.architecture == "gpt2":
        return _gpt2_costs(spec, seq_len)
    return _llama_costs(spec, seq_len)


def tensor_parallel_share(model: ModelCosts, tp: int) -> ModelCosts:
    """What one rank of a `tp`-wide tensor-parallel group holds and computes, per token of its
    data-parallel micro-batch: matmul weights and FLOPs / tp (column/row parallel), attention / tp
    (heads split), activations and elementwise work / tp (sequence parallel between the regions,
    heads or FFN columns inside them) but for the gathered inputs of the column-parallel matmuls,
    kept whole (`UnitCost.gathered_elems`; a mixture of experts' dispatch buffers too,
    `UnitCost.dispatch_elems`), the vocabulary / tp (vocabulary-parallel embedding and
    loss). Norm weights are replicated. The head keeps its whole input: the loss all-gathers the
    sequence.

    Whole-model counts (`num_params` for display, `flops_params` and the attention convention for
    MFU) stay those of the model. Repeated blocks stay one object, so they still price once.
    """
    if tp == 1:
        return model
    shares: dict[int, UnitCost] = {}

    def share(u: UnitCost) -> UnitCost:
        if id(u) not in shares:
            whole = u.gathered_elems + u.dispatch_elems  # kept whole on every tensor-parallel rank
            shares[id(u)] = replace(
                u,
                num_params=(u.num_params - u.replicated_params) // tp + u.replicated_params,
                matmul_params=u.matmul_params // tp,
                attention_flops=u.attention_flops / tp,
                elementwise_elems=u.elementwise_elems / tp,
                saved_elems=(u.saved_elems - whole) / tp + whole,
                compiled_saved_elems=(
                    None if u.compiled_saved_elems is None else (u.compiled_saved_elems - whole) / tp + whole
                ),
                saved_fp32_elems=u.saved_fp32_elems / tp,
                op_saved_elems=(u.op_saved_elems - u.op_routing_elems) / tp + u.op_routing_elems,
                op_recompute_matmul_params=u.op_recompute_matmul_params // tp,
                input_elems=u.input_elems if u is model.head else u.input_elems / tp,
                attention_output_elems=u.attention_output_elems / tp,
                linear_share=tp,
                kv_elems=u.kv_elems / tp,
                expert_matmul_params=u.expert_matmul_params // tp,
                expert_params=u.expert_params // tp,
                inactive_params=u.inactive_params // tp,
                expert_saved_elems=u.expert_saved_elems / tp,
            )
        return shares[id(u)]

    embedding, blocks, head = share(model.embedding), tuple(share(b) for b in model.blocks), share(model.head)
    return replace(
        model,
        embedding=embedding,
        blocks=blocks,
        head=head,
        vocab_size=model.vocab_size // tp,
        tensor_parallel=tp,
        share_params=sum(u.num_params for u in (embedding, *blocks, head)),
    )


def expert_parallel_share(model: ModelCosts, ep: int) -> ModelCosts:
    """What one rank of an `ep`-wide expert-parallel group holds and computes (of its tensor-parallel
    share): each MoE block's num_experts / ep routed experts, whose parameters are the only ones it
    gathers and reduces for them, and their grouped GEMMs at the rows the whole group routes to them
    (`routed_experts` / ep experts at the same tokens x top-k rows per rank: each expert's rows x ep,
    planner/cost/gemm.py `expert_rows`). Per-token FLOPs, activations and dispatch buffers stay: a rank
    receives as many routed rows as it sends; op-level checkpointing keeps the all-to-alls' outputs
    besides (`UnitCost.exchange_elems`). Repeated blocks stay one object."""
    if ep == 1:
        return model
    shares: dict[int, UnitCost] = {}

    def share(u: UnitCost) -> UnitCost:
        if not u.routed_experts:
            return u
        if id(u) not in shares:
            local = u.expert_params // ep
            shares[id(u)] = replace(
                u,
                num_params=u.num_params - u.expert_params + local,
                op_saved_elems=u.op_saved_elems + u.exchange_elems,
                expert_params=local,
                inactive_params=u.inactive_params // ep,
                routed_experts=u.routed_experts // ep,
            )
        return shares[id(u)]

    blocks = tuple(share(b) for b in model.blocks)
    moved = sum(a.num_params - b.num_params for a, b in zip(model.blocks, blocks, strict=True))
    share_params = model.rank_params - moved
    return replace(model, blocks=blocks, expert_parallel=ep, share_params=share_params)


def context_parallel_share(model: ModelCosts, cp: int) -> ModelCosts:
    """What one rank of a `cp`-wide context-parallel group holds and computes, per token of its own
    (1/cp of each sequence, in load-balanced chunks, so the causal attention work per token is the
    whole sequence's average): the same per-token costs, plus, saved for backward in every attention
    block, the keys and values all-gathered from the other cp - 1 ranks (attention's backward needs
    them whole). Repeated blocks stay one object."""
    if cp == 1:
        return model
    shares: dict[int, UnitCost] = {}

    def share(u: UnitCost) -> UnitCost:
        if id(u) not in shares:
            gathered = u.kv_elems * (cp - 1)
            compiled = None if u.compiled_saved_elems is None else u.compiled_saved_elems + gathered
            shares[id(u)] = (
                replace(
                    u,
                    saved_elems=u.saved_elems + gathered,
                    op_saved_elems=u.op_saved_elems + gathered,
                    compiled_saved_elems=compiled,
                )
                if gathered
                else u
            )
        return shares[id(u)]

    return replace(model, blocks=tuple(share(b) for b in model.blocks), context_parallel=cp)


def pipeline_rank_share(
    model: ModelCosts, blocks: tuple[int, ...], *, first: bool, last: bool
) -> ModelCosts:
    """What one pipeline rank holds and computes: the blocks `blocks` (indices into the model's), the
    embeddings when it holds the first stage, the final norm, head and loss when it holds the last
    (else empty units and no vocabulary: no logits). Repeated blocks stay one object."""
    embedding = model.embedding if first else _empty_unit("embedding")
    head = model.head if last else _empty_unit("head")
    kept = tuple(model.blocks[i] for i in blocks)
    return replace(
        model,
        embedding=embedding,
        blocks=kept,
        head=head,
        vocab_size=model.vocab_size if last else 0,
        pipeline_stage=True,
        share_params=sum(u.num_params for u in (embedding, *kept, head)),
    )


@functools.cache
def _empty_unit(name: str) -> UnitCost:
    """A unit that holds and computes nothing (the embeddings or head a pipeline rank lacks)."""
    return UnitCost(
        name=name, num_params=0, matmul_params=0, gemms=0, attention_flops=0.0,
        attention_flops_convention=0.0, elementwise_elems=0.0, kernels=0, saved_elems=0.0,
        op_saved_elems=0.0, op_recompute_matmul_params=0, input_elems=0.0, tensors=0, is_block=False,
    )


def eager_saved_bytes(unit: UnitCost, act_bytes: int) -> float:
    """Bytes per token eager autograd keeps for a unit's backward at a compute dtype of `act_bytes`."""
    return unit.saved_elems * act_bytes + unit.saved_fp32_elems * max(0, 4 - act_bytes)


def count_parameters(spec: ModelSpec) -> int:
    """Total parameters (tied weights counted once)."""
    return model_costs(spec, 1).num_params


def _attention_flops(spec: ModelSpec, seq_len: int) -> tuple[float, float]:
    # Per token and layer: QK^T and AV are 2 matmuls of 2*seq*(heads x head width) FLOPs each (the
    # hidden size unless the heads have a width of their own); causal masking lets flash attention skip
    # about half, which the convention (and MFU) ignores.
    convention = 4.0 * seq_len * spec.attention_width
    return convention / 2.0, convention


def _llama_attention(spec: ModelSpec, seq_len: int) -> Attention:
    if spec.latent_attention is not None:
        return latent_attention(
            h=spec.hidden_size, heads=spec.num_heads, latent=spec.latent_attention, seq_len=seq_len
        )
    return grouped_query_attention(
        h=spec.hidden_size, a=spec.attention_width, kv=spec.kv_heads * spec.head_dim, head_dim=spec.head_dim,
        seq_len=seq_len, qkv_bias=spec.qkv_bias, qk_norm=spec.qk_norm,
    )


def _llama_block(attention: Attention, ffn: FeedForward, *, h: int) -> UnitCost:
    """One block of the llama family: its attention half and feed-forward half added. Under tensor
    parallelism with sequence parallelism each half all-gathers the sequence before its
    column-parallel matmuls and reduce-scatters after its row-parallel ones."""
    part = attention.part + ffn.part
    return UnitCost(
        name="block" if not ffn.routed_experts else "moe_block",
        num_params=part.num_params,
        matmul_params=part.matmul_params,
        gemms=part.gemms,
        attention_flops=part.attention_flops,
        attention_flops_convention=part.attention_flops_convention,
        elementwise_elems=part.elementwise_elems,
        kernels=part.kernels,
        saved_elems=part.saved_elems,
        compiled_saved_elems=part.compiled_saved_elems,
        saved_fp32_elems=part.saved_fp32_elems,
        op_saved_elems=part.op_saved_elems,
        op_recompute_matmul_params=part.op_recompute_matmul_params,
        input_elems=h,
        attention_output_elems=part.attention_output_elems,
        tensors=part.tensors,
        replicated_params=part.replicated_params,
        tp_collectives=4,
        tp_collective_elems=4 * h,
        gathered_elems=2 * h,  # the norm outputs, gathered for attention's and the MLP's projections
        linear_shapes=(*attention.linear_shapes, *ffn.linear_shapes),
        kv_elems=part.kv_elems,
        expert_shapes=ffn.expert_shapes,
        routed_experts=ffn.routed_experts,
        experts_per_token=ffn.experts_per_token,
        expert_matmul_params=part.expert_matmul_params,
        expert_params=part.expert_params,
        inactive_params=part.inactive_params,
        dispatch_elems=part.dispatch_elems,
        expert_saved_elems=part.expert_saved_elems,
        op_routing_elems=part.op_routing_elems,
        exchange_elems=part.exchange_elems,
    )


def _llama_costs(spec: ModelSpec, seq_len: int) -> ModelCosts:
    h, v = spec.hidden_size, spec.vocab_size
    attention = _llama_attention(spec, seq_len)
    dense = _llama_block(attention, dense_feed_forward(h=h, f=spec.ffn_size), h=h)
    moe = spec.moe
    # One object per kind of block: the cost model prices a run of the same object once.
    if moe is None:
        blocks = (dense,) * spec.num_layers
    else:
        ffn = moe_feed_forward(h=h, moe=moe, matmuls_before=attention.part.gemms)
        routed = _llama_block(attention, ffn, h=h)
        blocks = tuple(routed if moe.is_moe_layer(i) else dense for i in range(spec.num_layers))
    # The vocabulary-parallel embedding reduce-scatters its output onto the sequence shards.
    embedding = replace(_embedding_unit(v * h, h, tensors=1), tp_collectives=1, tp_collective_elems=h)
    head_params = h + (0 if spec.tie_word_embeddings else v * h)
    head = _head_unit(
        head_params, v * h, h, v, tensors=1 if spec.tie_word_embeddings else 2, fp32_norm_input=True
    )
    # The final hidden states are all-gathered for the vocabulary-parallel loss, which all-reduces
    # three per-token statistics (max, sum of exponentials, target logit) per slice.
    head = replace(head, replicated_params=h, tp_collectives=4, tp_collective_elems=h + 3)
    total = embedding.num_params + sum(b.num_params for b in blocks) + head_params
    active = total - sum(b.inactive_params for b in blocks)
    n = active - v * h + (v * h if spec.tie_word_embeddings else 0)
    return ModelCosts(
        embedding, blocks, head, total, v * h, v, seq_len, n, active_params=None if moe is None else active
    )


def _gpt2_costs(spec: ModelSpec, seq_len: int) -> ModelCosts:
    h, f, v = spec.hidden_size, spec.ffn_size, spec.vocab_size
    attn_weights = 4 * h * h
    mlp_weights = 2 * h * f
    block_params = attn_weights + mlp_weights + 3 * h + h + f + h + 4 * h  # biases + 2 LayerNorms
    attn, attn_conv = _attention_flops(spec, seq_len)
    block = UnitCost(
        name="block",
        num_params=block_params,
        matmul_params=attn_weights + mlp_weights,
        gemms=4,
        attention_flops=attn,
        attention_flops_convention=attn_conv,
        elementwise_elems=2 * 6 * h + 6 * h + 4 * f,
        kernels=30,
        saved_elems=9 * h + 2 * f,
        # Compiled: the block input, both LayerNorm outputs, q, k, v, attention output, the output
        # projection's result, c_fc's output and its GELU (the residual sums are recomputed).
        compiled_saved_elems=8 * h + 2 * f,
        op_saved_elems=5 * h + f,
        op_recompute_matmul_params=h * h + h * f,
        input_elems=h,
        attention_output_elems=h,
        tensors=12,  # 4 projections and 2 LayerNorms, each a weight and a bias
        linear_shapes=((h, (3 * h,)), (h, (h,)), (h, (f,)), (f, (h,))),  # fused qkv, out, fc, proj
    )
    embed_params = v * h + spec.max_seq_len * h
    embedding = _embedding_unit(embed_params, h, tensors=2)
    head_params = 2 * h + (0 if spec.tie_word_embeddings else v * h)
    head = _head_unit(head_params, v * h, h, v, tensors=2 if spec.tie_word_embeddings else 3)
    total = embed_params + block_params * spec.num_layers + head_params
    n = total - embed_params + (v * h if spec.tie_word_embeddings else 0)
    return ModelCosts(embedding, (block,) * spec.num_layers, head, total, embed_params, v, seq_len, n)


def _layer_graph_costs(spec: ModelSpec, seq_len: int) -> ModelCosts:
    units = spec.layer_graph or []
    block_indices = [i for i, u in enumerate(units) if u.is_block]
    # Identical modules become one object, as the built-in architectures' blocks are: the cost
    # model then prices a run of them once (planner/cost/repeats.py). Names are not priced.
    interned: dict[tuple, UnitCost] = {}

    def priced(unit: LayerUnit) -> UnitCost:
        key = (unit.num_params, unit.fwd_flops_per_token, unit.activation_bytes_per_token, unit.is_block)
        if key not in interned:
            interned[key] = _traced_unit(unit)
        return interned[key]

    if not block_indices:
        # Nothing repeated: every module is its own unit.
        before, blocks, after = [], tuple(priced(u) for u in units), []
    else:
        first = block_indices[0]
        before = [_traced_unit(u) for u in units[:first]]
        blocks = tuple(priced(u) for u in units[first:] if u.is_block)
        # Non-block modules after the first block (final norm, head) form the output unit.
        after = [_traced_unit(u) for u in units[first:] if not u.is_block]
    total = sum(u.num_params for u in units)
    # Traced FLOPs are what they are: 6N here is 3x the measured forward FLOPs.
    n = int(sum(u.fwd_flops_per_token for u in units) / 2)
    return ModelCosts(_merge("embedding", before), blocks, _merge("head", after), total, 0, 0, seq_len, n)


def _traced_unit(unit: LayerUnit) -> UnitCost:
    # A traced module reports FLOPs and saved bytes directly; bytes are taken at 2 per element
    # (bf16), matching how `fsdp-planner trace` measures them.
    elems = unit.activation_bytes_per_token / 2.0
    return UnitCost(
        name=unit.name,
        num_params=unit.num_params,
        matmul_params=int(unit.fwd_flops_per_token // 2),
        gemms=1 if unit.num_params else 0,
        attention_flops=0.0,
        attention_flops_convention=0.0,
        elementwise_elems=2 * elems,
        kernels=10,
        saved_elems=elems,
        op_saved_elems=elems / 2,
        op_recompute_matmul_params=int(unit.fwd_flops_per_token // 4),
        input_elems=elems / 8,
        tensors=1 if unit.num_params else 0,
        is_block=unit.is_block,
    )


def _merge(name: str, units: list[UnitCost]) -> UnitCost:
    return UnitCost(
        name=name,
        num_params=sum(u.num_params for u in units),
        matmul_params=sum(u.matmul_params for u in units),
        gemms=sum(u.gemms for u in units),
        attention_flops=0.0,
        attention_flops_convention=0.0,
        elementwise_elems=sum(u.elementwise_elems for u in units),
        kernels=sum(u.kernels for u in units),
        saved_elems=sum(u.saved_elems for u in units),
        op_saved_elems=sum(u.saved_elems for u in units),
        op_recompute_matmul_params=0,
        input_elems=sum(u.input_elems for u in units),
        tensors=sum(u.tensors for u in units),
        is_block=False,
    )


def _embedding_unit(params: int, h: int, *, tensors: int) -> UnitCost:
    return UnitCost(
        name="embedding",
        num_params=params,
        matmul_params=0,
        gemms=0,
        attention_flops=0.0,
        attention_flops_convention=0.0,
        elementwise_elems=2 * h,
        kernels=2,
        saved_elems=0,
        op_saved_elems=0,
        op_recompute_matmul_params=0,
        input_elems=0,
        tensors=tensors,
        is_block=False,
    )


def _head_unit(
    params: int, matmul_params: int, h: int, v: int, *, tensors: int, fp32_norm_input: bool = False
) -> UnitCost:
    # Final norm, output projection and the loss. The logits themselves are priced separately
    # by the memory model; here: the norm's saved tensors and the softmax's elementwise passes.
    return UnitCost(
        name="head",
        num_params=params,
        matmul_params=matmul_params,
        gemms=1,
        attention_flops=0.0,
        attention_flops_convention=0.0,
        elementwise_elems=16 * h + 6 * v,
        kernels=14,
        saved_elems=2 * h,
        saved_fp32_elems=h if fp32_norm_input else 0.0,
        op_saved_elems=2 * h,
        op_recompute_matmul_params=0,
        input_elems=h,
        tensors=tensors,
        is_block=False,
    )
