"""Context parallelism (cp) for the built-in Llama: every sequence split over the cp ranks, with
all-gather attention, the way Llama 3 was trained (Meta's Llama 3 paper, "context parallelism").

Layout. A sequence of T tokens is cut into 2 x cp equal chunks; cp rank i holds chunks i and
2cp - 1 - i (`local_positions`). Under the causal mask an early chunk attends few keys and a late
one many: one of each per rank gives every rank the same attention work (load balancing). Everything
but attention works token by token, so embeddings, norms, MLPs and the loss run unchanged on the
rank's T / cp tokens.

Attention (`ContextParallelAttention`): each rank projects q, k, v of its own tokens, rotates q and k
at their global positions (RoPE), all-gathers the rotated K and V over the cp group (one collective
per block, K and V stacked; grouped-query attention keeps it small) and puts them in position
order. Each of its query chunks then attends the keys up to its own end, causally within the chunk
(`attend_local_queries`: a lower-right causal SDPA per chunk, no work on keys a chunk cannot see;
in eager mode torch's `causal_lower_right` bias, which CUDA's flash and memory-efficient kernels
apply without a mask tensor; compiled, explicit boolean masks of [chunk, keys up to its end]).
The all-gather is autograd-aware (a functional collective): its backward reduce-scatters, summing
every rank's gradient for a key/value onto the rank that owns it.

Loss and gradients (`ContextParallelLlama`). Each rank's loss is the mean over its own tokens; its
gradient flows as is, and since every cp rank holds as many tokens, the mean of the cp ranks'
gradients is the gradient of the whole sequences' mean. That mean is what the data-parallel
engines already take: the cp ranks hold the same parameters, so FSDP2 and SimpleFSDP shard and
reduce over dp_shard x cp (the flattened `dp_shard_cp` dim, `distributed.data_parallel_dims`;
no_shard: replicas over dp_replicate x cp). The loss *value* returned is the cp group's mean (one
detached scalar all-reduce), i.e. the one-process loss of the same sequences, so logging and
evaluation need not know about cp. The data loader gives the cp ranks of one data-parallel rank
the same sequences (`distributed.data_parallel_rank` ignores cp); each keeps its own chunks.

Pipelines: under pp each stage's module is a `ContextParallelLlama` of the stage's parts (its
forward splits the token ids on the first stage, the targets and the loss on the last), so a stage
boundary carries this rank's [micro-batch, T / cp, hidden] states to the same cp rank of the next
stage (pp is outermost: the pp group of a rank is the ranks at its cp and tp position), and every
stage's attention all-gathers over its own cp group, torchtitan's composition.

Composition: tensor parallelism is innermost (applied first; a cp group is cp x tp consecutive
ranks). Within a cp rank the tp ranks split its T / cp tokens again (sequence parallelism) and
attention's heads; the K/V all-gather is then of this tp rank's heads. Activation checkpointing
recomputes the all-gather with the block; under torch.compile it is ordinary traced code.
`plan_document` refuses a sequence that does not split into 2 x cp x tp equal pieces.

One implementation for CPU and GPU. torch's own `torch.distributed.tensor.experimental.
context_parallel` (ring attention over SDPA) has no sharding rule for CPU's flash-attention op, so
it cannot run the CPU tests; on CUDA its ring (K/V shards passed around while attention computes)
would overlap the communication better than one all-gather per block, and is a possible follow-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.attention.bias import causal_lower_right

from contract.plan_document import PlanError, RuntimePlan
from executor.runtime.distributed import context_parallel_mesh
from executor.runtime.models.common import blocks_in_order, sdpa_causal
from executor.runtime.models.llama import Attention, Llama, RotaryEmbedding

# torch >= 2.6 names it `_single_`; older torch only has the (now deprecated) `_tensor_` spelling.
_all_gather_autograd = (
    getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
)


def load_balanced_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two of the 2 x cp chunks of a sequence that cp rank `rank` holds: `rank` and its mirror."""
    if not 0 <= rank < cp:
        raise ValueError(f"cp rank {rank} is not in 0..{cp - 1}")
    return rank, 2 * cp - 1 - rank


def local_positions(
    seq_len: int, *, cp: int, rank: int, device: torch.device | None = None
) -> torch.Tensor:
    """Global positions (int64, ascending) of the seq_len / cp tokens rank `rank` holds of a
    sequence of `seq_len` tokens."""
    if seq_len % (2 * cp):
        raise ValueError(f"a sequence of {seq_len} tokens does not split into 2 x cp {cp} equal chunks")
    chunk = seq_len // (2 * cp)
    first, second = load_balanced_chunks(cp, rank)
    return torch.cat([
        torch.arange(first * chunk, (first + 1) * chunk, device=device),
        torch.arange(second * chunk, (second + 1) * chunk, device=device),
    ])


def split_sequence(x: torch.Tensor, *, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's two chunks of `x` along the sequence `dim` (in position order)."""
    if x.shape[dim] % (2 * cp):
        raise ValueError(
            f"a sequence of {x.shape[dim]} tokens does not split into 2 x cp {cp} equal chunks; make a plan "
            f"whose sequence length is a multiple of {2 * cp} (times tp)"
        )
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[i] for i in load_balanced_chunks(cp, rank)], dim=dim)


def in_position_order(gathered: torch.Tensor, *, cp: int, dim: int) -> torch.Tensor:
    """The whole sequence from an all-gather over the cp group along `dim` (rank 0's two chunks,
    rank 1's, ...): its 2 x cp chunks put back in position order (one copy)."""
    pieces = gathered.chunk(2 * cp, dim=dim)  # piece 2r: rank r's first chunk, 2r + 1: its second
    where = {}
    for rank in range(cp):
        first, second = load_balanced_chunks(cp, rank)
        where[first], where[second] = pieces[2 * rank], pieces[2 * rank + 1]
    return torch.cat([where[i] for i in range(2 * cp)], dim=dim)


def lower_right_causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [q_len, k_len] for queries that are the last q_len of k_len positions: query i attends
    keys 0 .. i + (k_len - q_len)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)


def lower_right_biases(seq_len: int, *, cp: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same masks as torch attention biases (`causal_lower_right`), one per chunk of this rank:
    no mask tensor exists, and CUDA's flash and memory-efficient kernels apply them themselves.
    Made once, outside forward: they are tensor subclasses, which cannot be created under
    activation checkpointing's dispatch modes, nor traced by torch.compile."""
    chunk = seq_len // (2 * cp)
    first, second = load_balanced_chunks(cp, rank)
    return (causal_lower_right(chunk, (first + 1) * chunk), causal_lower_right(chunk, (second + 1) * chunk))


def attend_local_queries(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    cp: int,
    rank: int,
    biases: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Causal attention of this rank's queries ([b, heads, seq / cp, d]: its two chunks, rotated
    at their positions) to the whole sequence's keys and values ([b, kv_heads, seq, d], in position
    order). Chunk c's queries attend keys 0 .. end of chunk c, the last chunk's causally: one
    lower-right causal attention per chunk, so the keys after a chunk are never computed. The masks
    are `biases` (`lower_right_biases`) when given and of this length, else explicit boolean ones
    of [chunk, end]."""
    chunk = q.shape[-2] // 2
    outs = []
    chunks = zip(q.split(chunk, dim=-2), load_balanced_chunks(cp, rank), strict=True)
    for j, (queries, c) in enumerate(chunks):
        end = (c + 1) * chunk
        mask = biases[j] if biases is not None else None
        if mask is None or (mask.seq_len_q, mask.seq_len_kv) != (chunk, end):  # type: ignore[attr-defined]
            # Compiled, or a sequence of another length than the plan's: an explicit mask.
            mask = lower_right_causal_mask(chunk, end, q.device)
        outs.append(sdpa_causal(queries, keys[..., :end, :], values[..., :end, :], mask=mask))
    return torch.cat(outs, dim=-2)


@dataclass(frozen=True, slots=True)
class ContextShard:
    """This rank's place in its cp group (plain values: constants to the compiler)."""

    group: str
    """Process-group name of the cp group (functional collectives trace with names)."""
    rank: int
    """This rank's index in the group."""
    size: int
    """cp: ranks per group."""

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a [batch, seq, ...] tensor."""
        return split_sequence(x, cp=self.size, rank=self.rank, dim=1)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The whole sequence, in position order, from every rank's [batch, seq / cp, ...] `x`."""
        return in_position_order(_all_gather_autograd(x.contiguous(), 1, self.group), cp=self.size, dim=1)

    def group_mean(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` (this rank's mean over its tokens) with the cp group's mean as its value and its
        own gradient (see the module docstring: the engines average gradients over the cp ranks)."""
        local = loss.detach()
        total = funcol.all_reduce(local, "sum", self.group)
        return loss + (total / self.size - local)


class ContextParallelAttention(Attention):
    """An `Attention` whose tokens are this rank's chunks of the sequence: keys and values come
    from the whole cp group. Made from an `Attention` by `apply_context_parallel` (same parameters)."""

    context: ContextShard
    biases: tuple[torch.Tensor, torch.Tensor]
    """This rank's two lower-right causal masks as attention biases (`lower_right_biases`)."""

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryEmbedding
    ) -> torch.Tensor:
        cp = self.context
        positions = local_positions(q.shape[-2] * cp.size, cp=cp.size, rank=cp.rank, device=q.device)
        # [b, heads, seq / cp, d] -> the whole sequence (dim 3 of the K/V stack), in position order.
        kv = _all_gather_autograd(torch.stack([rope(k, positions), v]), 3, cp.group)
        keys, values = in_position_order(kv, cp=cp.size, dim=3).unbind(0)
        # The compiler traces explicit masks (it cannot trace the bias subclass).
        biases = None if torch.compiler.is_compiling() else self.biases
        return attend_local_queries(rope(q, positions), keys, values, cp=cp.size, rank=cp.rank, biases=biases)


class ContextParallelLlama(Llama):
    """A `Llama` whose forward keeps this rank's chunks of the tokens (and targets), returning the
    cp group's mean loss, or without targets the whole sequence's logits (gathered, for inspection).
    Made from a `Llama` by `apply_context_parallel` (same modules and parameters).

    The same forward runs a pipeline stage (a Llama without embeddings, or without the head:
    `executor.runtime.pipeline`): only the stage holding the embeddings splits the token ids; a later
    stage gets this rank's T / cp hidden states from the stage before (the same rank's chunks, at
    the same cp rank of the pipeline's previous stage); only the stage holding the head splits the
    targets and takes the group's mean loss. Every stage's attention is the cp all-gather's."""

    context: ContextShard

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, loss_chunks: int = 1
    ) -> torch.Tensor:
        cp = self.context
        holds_head = self.output is not None
        inputs = cp.split(tokens) if self.tok_embeddings is not None else tokens
        local_targets = None if targets is None or not holds_head else cp.split(targets)
        out = super().forward(inputs, local_targets, loss_chunks=loss_chunks)
        if not holds_head:
            return out  # hidden states of this rank's chunks, for the next pipeline stage
        if targets is None:
            return cp.gather(out)
        return cp.group_mean(out)


def apply_context_parallel(model: nn.Module, *, plan: RuntimePlan, mesh: DeviceMesh) -> str | None:
    """Split every sequence over the plan's cp ranks (`plan.config.mesh.cp`) in place: `model` is
    the built-in Llama (typically on the meta device, after tensor parallelism), `mesh` the job's
    mesh (`distributed.build_mesh`). Returns the note to log, None when cp is 1."""
    cp = plan.config.mesh.cp
    if cp == 1:
        return None
    blocks = blocks_in_order(model.layers) if type(model) is Llama else []
    if type(model) is not Llama or any(type(block.attention) is not Attention for block in blocks):
        raise PlanError(
            f"plan.config.mesh.cp: context parallelism ({cp}) is implemented for the built-in llama model "
            f"only, this model is a {type(model).__name__}; make a plan with cp 1"
        )
    cp_mesh = context_parallel_mesh(mesh)
    if cp_mesh.size() != cp:
        raise ValueError(f"the mesh's cp dim has {cp_mesh.size()} ranks, the plan {cp}")
    shard = ContextShard(group=cp_mesh.get_group().group_name, rank=cp_mesh.get_local_rank(), size=cp)
    biases = lower_right_biases(plan.training.seq_len, cp=cp, rank=shard.rank)
    for block in blocks:
        block.attention.__class__ = ContextParallelAttention
        block.attention.context = shard
        block.attention.biases = biases
    model.__class__ = ContextParallelLlama
    model.context = shard  # type: ignore[attr-defined]
    tokens = plan.training.seq_len // cp
    return (
        f"context parallel: cp={cp} ({tokens} tokens of every sequence per rank in 2 load-balanced chunks; "
        "K/V all-gathered per block; loss averaged over the cp group)"
    )
