"""The mixture-of-experts feed-forward of the llama family: router, top-k routing, routed experts as
stacked weights run by one grouped matmul, shared experts, and load balancing (an auxiliary loss, or
DeepSeek-V3's per-expert bias adjusted between steps).

One forward, in four steps, so that expert parallelism can replace the middle two:
  route     router scores -> each token's top-k experts and their weights (`Router`)
  dispatch  token copies sorted by expert, with the number per expert (`LocalDispatcher.dispatch`)
  experts   every expert's SwiGLU over its own rows, one grouped matmul per projection (`GroupedExperts`)
  combine   expert outputs back to their tokens, weighted and summed over the k choices (`.combine`)
`LocalDispatcher` keeps every expert on this rank; with expert parallelism
`executor.runtime.expert_parallel.AllToAllDispatcher` takes its place (all_to_all_single of the sorted
rows over the ep group, their counts per expert exchanged first) and the experts hold the rank's share.

Shapes are static everywhere but in the grouped matmul's group sizes, which `grouped_mm.grouped_matmul`
keeps inside one operator (`torch._grouped_mm` on CUDA bf16, a custom per-expert loop elsewhere): the
model compiles into one graph (`fullgraph=True`) with no graph break and no capacity factor.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Shard

from contract.model_config import MoeConfig
from executor.runtime.models.grouped_mm import grouped_matmul
from executor.runtime.models.layers import FeedForward

AUX_LOSS_COEF = 0.01
"""Weight of the load-balancing loss of softmax routers without a bias (Switch Transformer's 0.01)."""
BIAS_UPDATE_RATE = 1e-3
"""DeepSeek-V3's bias update speed (gamma): each step every expert's bias moves by this much."""


def expert_of_rows(counts: torch.Tensor, rows: int) -> torch.Tensor:
    """The expert of each of `rows` rows sorted by expert, `counts[e]` rows for expert e (int64
    [rows]; static shapes, unlike `repeat_interleave` by counts, which the compiler cannot size)."""
    ends = torch.cumsum(counts, 0)
    return torch.searchsorted(ends, torch.arange(rows, device=counts.device), right=True)


def local_weight(w: torch.Tensor | None) -> torch.Tensor | None:
    """A weight as this rank computes with it: itself, or under tensor or expert parallelism (a
    DTensor on the tp, ep or (ep, tp) mesh) its local shard; its gradient is declared partial on the
    dims that replicate it, as each tp rank's is its share of the experts' (summed over the ranks by
    the conversion back)."""
    if not isinstance(w, DTensor):
        return w
    if all(p.is_shard() for p in w.placements):
        return w.to_local()
    return w.to_local(grad_placements=[Partial() if p.is_replicate() else p for p in w.placements])


class Routing(NamedTuple):
    """Each token's choices: `experts` [tokens, k] (int64), `weights` [tokens, k] (fp32), and the
    router's scores [tokens, experts] (fp32, softmax or sigmoid) for the auxiliary loss."""

    experts: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor


class Router(nn.Module):
    """Scores the experts for each token (a linear, then softmax or sigmoid in fp32) and
    picks the top k, their weights renormalised to sum to 1. With `router_bias` a per-expert bias
    (a buffer, changed between steps by `update_router_bias`, not by the optimizer) is added to the
    scores for choosing only (DeepSeek-V3's auxiliary-loss-free balancing)."""

    def __init__(self, hidden: int, moe: MoeConfig) -> None:
        super().__init__()
        self.top_k, self.score = moe.experts_per_token, moe.router
        # gpt-oss's routers carry a bias with its experts' (`expert_bias`).
        self.gate = nn.Linear(hidden, moe.num_experts, bias=moe.expert_bias)
        self.has_bias = moe.router_bias
        self.tp = 1
        """Tensor-parallel ranks (`tensor_parallel.ExpertTensorParallel` sets it): > 1, the weights
        are DTensors on the tp mesh and the input this rank's local tokens."""
        # Persistent: a checkpoint resumes with the balance reached. The load counts are per step.
        self.register_buffer("score_bias", torch.zeros(moe.num_experts) if moe.router_bias else None)
        self.register_buffer(
            "tokens_per_expert",
            torch.zeros(moe.num_experts, dtype=torch.int64) if moe.router_bias else None,
            persistent=False,
        )

    def forward(self, x: torch.Tensor) -> Routing:
        gate = self.gate
        if self.tp == 1:
            logits = gate(x).float()
        else:
            logits = F.linear(x, local_weight(gate.weight), local_weight(gate.bias)).float()
        scores = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
        choosing = scores + self.score_bias if self.has_bias else scores
        _, experts = torch.topk(choosing, self.top_k, dim=-1)
        weights = scores.gather(-1, experts)
        weights = weights / weights.sum(-1, keepdim=True)
        if self.has_bias and self.training:
            # The step's load, for the bias update after it (a recomputed block counts twice: the
            # update only reads each expert's load against the mean, so that changes nothing).
            with torch.no_grad():
                self.tokens_per_expert.add_(torch.bincount(experts.flatten(), minlength=scores.shape[-1]))
        return Routing(experts=experts, weights=weights, scores=scores)

    def reset_buffers(self) -> None:
        if self.has_bias:
            self.score_bias.zero_()
            self.tokens_per_expert.zero_()


def load_balancing_loss(routing: Routing, num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss: E * sum_e f_e * P_e, with f_e the fraction of token
    choices routed to expert e and P_e its mean router probability; 1 when the load is uniform."""
    choices = routing.experts.numel()
    counts = torch.zeros(num_experts, device=routing.scores.device).scatter_add_(
        0, routing.experts.flatten(), torch.ones(choices, device=routing.scores.device)
    )
    fraction = counts / choices
    probability = routing.scores.mean(0)
    return num_experts * (fraction * probability).sum()


class _AuxLossGradient(torch.autograd.Function):
    """Identity on the block's output whose backward also sends `scale` as the gradient of `aux`:
    the auxiliary loss joins the training gradient without the model's forward returning it
    (the blocks return hidden states only, under FSDP, checkpointing, compile and pipelines alike)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        return grad, torch.full((), ctx.scale, device=grad.device, dtype=torch.float32), None


class _ScaleGradient(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by `scale` (an expert-parallel rank's expert
    weights: see `GroupedExperts.grad_scale`)."""

    @staticmethod
    def forward(ctx, w: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.scale, None


class Dispatched(NamedTuple):
    """What `LocalDispatcher.dispatch` hands the experts and what `combine` needs back."""

    rows: torch.Tensor
    """Token copies sorted by expert [tokens * k, hidden]."""
    tokens_per_expert: torch.Tensor
    """Rows per expert [experts] (int64)."""
    order: torch.Tensor
    """rows[i] is flattened choice order[i] (choice c = token c // k, its (c % k)-th expert)."""


class LocalDispatcher:
    """Every expert on this rank: dispatch is a sort by expert, combine its inverse. The seam where
    expert parallelism sends rows to the ranks holding their experts (all_to_all_single) and back."""

    def dispatch(self, x: torch.Tensor, experts: torch.Tensor, num_experts: int) -> Dispatched:
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        rows = x[order // experts.shape[1]]
        counts = torch.bincount(flat, minlength=num_experts)
        return Dispatched(rows=rows, tokens_per_expert=counts, order=order)

    def combine(self, out: torch.Tensor, dispatched: Dispatched, weights: torch.Tensor) -> torch.Tensor:
        """Expert outputs [tokens * k, hidden] in dispatch order -> [tokens, hidden], each token's k
        outputs weighted by its routing weights and summed (in a fixed order: deterministic)."""
        unsorted = torch.empty_like(out).index_copy_(0, dispatched.order, out)
        tokens, k = weights.shape
        return (unsorted.view(tokens, k, -1) * weights.unsqueeze(-1).to(out.dtype)).sum(1)


class GroupedExperts(nn.Module):
    """`num_experts` SwiGLU experts as stacked weights: w1, w3 [E, hidden, ffn], w2 [E, ffn, hidden]
    (inputs times weights, the layout `torch._grouped_mm` takes), biases [E, width] when asked."""

    def __init__(self, hidden: int, ffn: int, *, num_experts: int, bias: bool) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        if bias:
            self.b1 = nn.Parameter(torch.empty(num_experts, ffn))
            self.b3 = nn.Parameter(torch.empty(num_experts, ffn))
            self.b2 = nn.Parameter(torch.empty(num_experts, hidden))
        self.bias = bias
        self.tp = 1
        """Tensor-parallel ranks: > 1, w1/w3 (and b1/b3) hold this rank's ffn columns, w2 its rows,
        and the output is this rank's partial sum (`tensor_parallel.ExpertTensorParallel`)."""
        self.grad_scale = 1.0
        """Multiplies the weights' gradients: under expert parallelism 1 / ep, as a rank's experts
        gather the gradients of its ep peers' tokens while the data-parallel engines average them over
        the (dp_shard x cp) / ep ranks holding the same experts only (`expert_parallel`)."""

    def forward(self, rows: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        # Read every weight once (SimpleFSDP gathers on each attribute read).
        w1, w2, w3 = (self._weight(w) for w in (self.w1, self.w2, self.w3))
        gate, up = grouped_matmul(rows, w1, tokens_per_expert), grouped_matmul(rows, w3, tokens_per_expert)
        # Each row's expert, once for the three biases: backward keeps one index per row, not three.
        expert = expert_of_rows(tokens_per_expert, rows.shape[0]) if self.bias else None
        if expert is not None:
            gate = gate + self._weight(self.b1)[expert]
            up = up + self._weight(self.b3)[expert]
        out = grouped_matmul(F.silu(gate) * up, w2, tokens_per_expert)
        if expert is not None:
            # Under tensor parallelism every rank's output is a partial sum: each adds 1/tp of it.
            out = out + self._weight(self.b2)[expert] / self.tp
        return out

    def _weight(self, w: torch.Tensor) -> torch.Tensor:
        local = local_weight(w)
        return local if self.grad_scale == 1.0 else _ScaleGradient.apply(local, self.grad_scale)


class MoEFeedForward(nn.Module):
    """The MoE block's feed-forward: routed experts (top-k of `num_experts`) plus shared experts
    every token goes through (one dense SwiGLU of num_shared_experts x their size)."""

    def __init__(self, hidden: int, moe: MoeConfig, *, aux_loss_coef: float = AUX_LOSS_COEF) -> None:
        super().__init__()
        self.num_experts = moe.num_experts
        self.router = Router(hidden, moe)
        self.experts = GroupedExperts(
            hidden, moe.expert_intermediate_size, num_experts=moe.num_experts, bias=moe.expert_bias
        )
        shared = moe.num_shared_experts * moe.shared_size
        self.shared = FeedForward(hidden, shared) if shared else None
        # A bias-balanced router needs no auxiliary loss (DeepSeek-V3).
        self.aux_loss_coef = 0.0 if moe.router_bias else aux_loss_coef
        self.aux_loss_scale = 1.0
        """Multiplies the auxiliary loss's gradient: the trainer sets 1 / micro-batches, as it divides
        each micro-batch's loss (`set_aux_loss_scale`)."""
        self.dispatcher = LocalDispatcher()

        self.tp = 1
        """Tensor-parallel ranks (`tensor_parallel.ExpertTensorParallel`): > 1, the input is the
        whole sequence as a replicated DTensor on the tp mesh, each rank computes a partial sum
        (its share of every expert's and the shared experts' hidden units) and the output is
        reduce-scattered back onto the sequence shards, as a dense block's row-parallel w2 does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return self._partial(x)
        assert isinstance(x, DTensor), "under tensor parallelism the MoE input is a replicated DTensor"
        partial = self._partial(x.to_local(grad_placements=[Partial()]))
        out = DTensor.from_local(partial, x.device_mesh, [Partial()])
        return out.redistribute(placements=[Shard(1)]).to_local()

    def _partial(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        routing = self.router(tokens)
        dispatched = self.dispatcher.dispatch(tokens, routing.experts, self.num_experts)
        out = self.experts(dispatched.rows, dispatched.tokens_per_expert)
        y = self.dispatcher.combine(out, dispatched, routing.weights)
        if self.shared is not None:
            y = y + self._shared(tokens)
        if self.training and self.aux_loss_coef > 0 and torch.is_grad_enabled():
            aux = load_balancing_loss(routing, self.num_experts)
            # Every tp rank adds the same loss to the router's partial gradient: 1/tp each.
            y = _AuxLossGradient.apply(y, aux, self.aux_loss_coef * self.aux_loss_scale / self.tp)
        return y.view(shape)

    def _shared(self, tokens: torch.Tensor) -> torch.Tensor:
        shared = self.shared
        if self.tp == 1:
            return shared(tokens)  # the module (Float8 may have converted its linears)
        w1, w2, w3 = (local_weight(m.weight) for m in (shared.w1, shared.w2, shared.w3))
        return F.linear(F.silu(F.linear(tokens, w1)) * F.linear(tokens, w3), w2)


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def set_aux_loss_scale(model: nn.Module, scale: float) -> None:
    """Scale every MoE block's auxiliary-loss gradient (the trainer: 1 / gradient accumulation steps)."""
    for layer in moe_layers(model):
        layer.aux_loss_scale = scale


@torch.no_grad()
def update_router_bias(
    model: nn.Module, *, rate: float = BIAS_UPDATE_RATE, group: dist.ProcessGroup | None = None
) -> None:
    """DeepSeek-V3's balancing, after each optimizer step: every bias-balanced router's expert
    bias moves by `rate` towards the under-loaded experts (sign of mean load minus the expert's),
    from the step's token counts summed over `group`'s ranks (default: all), then the counts restart."""
    for layer in moe_layers(model):
        router = layer.router
        if not router.has_bias:
            continue
        load = router.tokens_per_expert
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(load, group=group)
        counts = load.float()
        router.score_bias.add_(rate * torch.sign(counts.mean() - counts))
        load.zero_()


def has_bias_balanced_routers(model: nn.Module) -> bool:
    """Whether `model` has bias-balanced routers (the trainer then runs `update_router_bias`)."""
    return any(layer.router.has_bias for layer in moe_layers(model))
