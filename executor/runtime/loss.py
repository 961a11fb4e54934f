"""Output projection + cross-entropy in token slices, with the gradients computed in forward.

The plain loss `F.cross_entropy((h @ W.T).float(), targets)` keeps the logits for all tokens alive:
compute-dtype logits, their fp32 copy, and in backward the fp32 and compute-dtype logit gradients.
At 4 x 4096 tokens and a 128256-word vocabulary that alone is tens of GiB. Here the tokens are cut
into `chunks` slices; for each slice the logits are formed, reduced to that slice's loss sum, and
turned at once into the gradient w.r.t. the slice's hidden states and its share of the weight
gradient (softmax - one-hot, already divided by the token count). Nothing vocabulary-sized outlives
one slice, and backward only scales the stored gradients by the incoming one.

Within one slice (eager) the vocabulary-sized tensors alive at once are at most the compute-dtype
logits and their fp32 copy, then the fp32 probabilities and their compute-dtype copy: live bytes
~= slice_tokens x vocab x (itemsize(compute) + 4), i.e. 6 for bf16 and 4 for fp32 (fp32 needs no
copies). The weight gradient is accumulated in fp32 over the slices and cast to the weight's dtype
at the end.

Loss parallelism (tensor parallelism, `vocab_parallel_linear_cross_entropy`): the head weight is
split by vocabulary rows over the tp group and every rank holds all tokens' hidden states. Per
slice each rank forms only its vocabulary shard's logits (so logits memory is / tp), and three
per-token numbers are combined over the group: the row max (all-reduce MAX), then the sum of
exp(logit - max) and the target's logit, which only the rank owning the target id contributes
(one all-reduce SUM of both). The softmax gradient of a rank's shard then needs nothing more; its
hidden-state gradient is this shard's part of the sum, reduced by the caller
(`tensor_parallel.VocabParallelOutputHead`) together with the sequence scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol


@dataclass(frozen=True, slots=True)
class VocabShard:
    """Which rows of the vocabulary this rank's head weight holds, and the group holding the rest."""

    group: str
    """Process-group name of the tensor-parallel group (functional collectives trace with names)."""
    start: int
    """First vocabulary id of this rank's rows."""


def _slice_loss_and_grads(
    h: torch.Tensor,
    weight: torch.Tensor,
    t: torch.Tensor,
    grad_h: torch.Tensor | None,
    grad_weight: torch.Tensor | None,
    *,
    tokens: int,
    vocab: VocabShard | None,
) -> torch.Tensor:
    """One slice: returns its cross-entropy sum, writes d(mean loss)/d h into `grad_h` and adds
    its share of d(mean loss)/d weight to the fp32 `grad_weight`. With `vocab`, `weight` is this
    rank's vocabulary shard: the loss is the whole vocabulary's, `grad_h` this shard's part.
    Without `grad_h` (evaluation, no autograd) only the loss is computed.

    A function of its own so that its vocabulary-sized locals are freed when it returns, before
    the next slice allocates its logits (a loop body would keep the last ones alive until rebound).
    """
    # In-place from here on: one fp32 [slice, vocab] buffer becomes the softmax gradient.
    # (For fp32 inputs `.float()` returns the logits themselves: no copy at all.)
    z = (h @ weight.t()).float()
    if vocab is None:
        local_t, owned = t, None
    else:
        local_t = t - vocab.start
        owned = (local_t >= 0) & (local_t < z.shape[1])
        local_t = local_t.clamp(0, z.shape[1] - 1)  # any in-range index; `owned` masks it out
    target_logit = z.gather(1, local_t.unsqueeze(1)).squeeze(1)
    row_max = z.amax(dim=1)
    if vocab is not None:
        # Any shift is exact for the softmax; the global max keeps exp() in range on every rank.
        row_max = funcol.all_reduce(row_max, "max", vocab.group)
        target_logit = torch.where(owned, target_logit, 0.0)
    z.sub_(row_max.unsqueeze(1)).exp_()
    row_sum = z.sum(dim=1)
    if vocab is not None:
        totals = funcol.all_reduce(torch.stack([row_sum, target_logit]), "sum", vocab.group)
        row_sum, target_logit = totals.unbind(0)
    loss_sum = (row_max + row_sum.log() - target_logit).sum()
    if grad_h is None or grad_weight is None:
        return loss_sum
    # d(mean CE)/d logits = (softmax - one_hot) / tokens.
    z.mul_((row_sum * tokens).reciprocal().unsqueeze(1))
    one_hot = torch.full_like(z[:, :1], -1.0 / tokens)
    if owned is not None:
        one_hot = one_hot * owned.unsqueeze(1)  # only the owner of a target subtracts its one-hot
    z.scatter_add_(1, local_t.unsqueeze(1), one_hot)
    d_logits = z.to(h.dtype)
    del z  # bf16: drop the fp32 buffer before the matmuls allocate
    grad_h.copy_(d_logits @ weight)
    if h.dtype == torch.float32:
        grad_weight.addmm_(d_logits.t(), h)
    else:
        # Matmul in the compute dtype (fp32 accumulation inside), sum over slices in fp32.
        grad_weight.add_(d_logits.t() @ h)
    return loss_sum


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(hidden_i @ weight.T, targets_i) over [tokens, hidden] inputs, in slices."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunks: int,
        vocab: VocabShard | None,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        slices = zip(
            torch.tensor_split(hidden, chunks),
            torch.tensor_split(targets, chunks),
            torch.tensor_split(grad_hidden, chunks),
            strict=True,
        )
        for h, t, g in slices:
            loss_sum = loss_sum + _slice_loss_and_grads(
                h, weight, t, g, grad_weight, tokens=tokens, vocab=vocab
            )
        # Plain attributes, not save_for_backward: backward scales them in place (see there).
        ctx.grads = (grad_hidden, grad_weight.to(weight.dtype))  # type: ignore[attr-defined]
        ctx.scaled_by = None  # type: ignore[attr-defined]
        return loss_sum / tokens

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None, None, None]:
        grad_hidden, grad_weight = ctx.grads  # type: ignore[attr-defined]
        scaled_by = ctx.scaled_by  # type: ignore[attr-defined]
        if scaled_by is None:
            # In place: a head-sized copy at the start of backward is what slicing saves elsewhere
            # (~1 GiB for a 128k x 4096 bf16 head).
            ctx.scaled_by = grad_loss  # type: ignore[attr-defined]
            return grad_hidden.mul_(grad_loss), grad_weight.mul_(grad_loss), None, None, None
        # A second backward through the same graph (retain_graph; a zero-bubble pipeline schedule
        # computes the input and the weight gradients in two passes): the stored gradients hold
        # the first pass's scale, so rescale out of place (a first scale of 0 cannot be undone).
        ratio = grad_loss / scaled_by
        rescaled = (grad_hidden * ratio.to(grad_hidden.dtype), grad_weight * ratio.to(grad_weight.dtype))
        return *rescaled, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunks: int
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, computed `chunks` slices of
    tokens at a time (see the module docstring). `hidden` is [..., hidden] (the final norm's
    output), `weight` [vocab, hidden] (a bias-free head), `targets` int64 of `hidden`'s leading shape.
    Returns an fp32 scalar, as `F.cross_entropy` on fp32 logits would; gradients come back in the
    dtypes of `hidden` and `weight`."""
    return _apply(hidden, weight, targets, chunks=chunks, vocab=None)


def vocab_parallel_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunks: int, vocab: VocabShard
) -> torch.Tensor:
    """The same mean cross-entropy with `weight` holding only the vocabulary rows
    [vocab.start, vocab.start + weight.shape[0]) of the head, the rest on the other ranks of
    `vocab.group` (every rank passes the same `hidden` and `targets`, and gets the same loss).

    The gradient w.r.t. `hidden` is this rank's shard's part only: the caller sums it over the
    group (see the module docstring). The gradient w.r.t. `weight` is complete for its rows."""
    return _apply(hidden, weight, targets, chunks=chunks, vocab=vocab)


def _apply(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunks: int,
    vocab: VocabShard | None,
) -> torch.Tensor:
    if chunks < 1:
        raise ValueError(f"loss chunks must be >= 1, got {chunks}")
    if hidden.dtype != weight.dtype:
        # One compute dtype for the matmuls (mixed precision casts both to param_dtype).
        raise TypeError(f"hidden is {hidden.dtype} but the head weight is {weight.dtype}")
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if not torch.is_grad_enabled():
        # Evaluation: the same loss without the gradients (two of the head's three matmuls).
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for h, t in zip(torch.tensor_split(hidden, chunks), torch.tensor_split(targets, chunks), strict=True):
            loss_sum = loss_sum + _slice_loss_and_grads(
                h, weight, t, None, None, tokens=hidden.shape[0], vocab=vocab
            )
        return loss_sum / hidden.shape[0]
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunks, vocab)
