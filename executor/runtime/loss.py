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
"""

from __future__ import annotations

import torch


def _slice_loss_and_grads(
    h: torch.Tensor,
    weight: torch.Tensor,
    t: torch.Tensor,
    grad_h: torch.Tensor,
    grad_weight: torch.Tensor,
    *,
    tokens: int,
) -> torch.Tensor:
    """One slice: returns its cross-entropy sum, writes d(mean loss)/d h into `grad_h` and adds
    its share of d(mean loss)/d weight to the fp32 `grad_weight`.

    A function of its own so that its vocabulary-sized locals are freed when it returns, before
    the next slice allocates its logits (a loop body would keep the last ones alive until rebound).
    """
    # In-place from here on: one fp32 [slice, vocab] buffer becomes the softmax gradient.
    # (For fp32 inputs `.float()` returns the logits themselves: no copy at all.)
    z = (h @ weight.t()).float()
    target_logit = z.gather(1, t.unsqueeze(1)).squeeze(1)
    row_max = z.amax(dim=1)
    z.sub_(row_max.unsqueeze(1)).exp_()
    row_sum = z.sum(dim=1)
    loss_sum = (row_max + row_sum.log() - target_logit).sum()
    # d(mean CE)/d logits = (softmax - one_hot) / tokens.
    z.mul_((row_sum * tokens).reciprocal().unsqueeze(1))
    z.scatter_add_(1, t.unsqueeze(1), torch.full_like(z[:, :1], -1.0 / tokens))
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
            loss_sum = loss_sum + _slice_loss_and_grads(h, weight, t, g, grad_weight, tokens=tokens)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss_sum / tokens

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors  # type: ignore[attr-defined]
        # In place: a head-sized copy at the start of backward is what slicing saves elsewhere
        # (~1 GiB for a 128k x 4096 bf16 head). A second backward through the same graph
        # (retain_graph) is refused by autograd's version check instead of silently doubling.
        return grad_hidden.mul_(grad_loss), grad_weight.mul_(grad_loss), None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunks: int
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, computed `chunks` slices of
    tokens at a time (see the module docstring). `hidden` is [..., hidden] (the final norm's
    output), `weight` [vocab, hidden] (a bias-free head), `targets` int64 of `hidden`'s leading shape.
    Returns an fp32 scalar, as `F.cross_entropy` on fp32 logits would; gradients come back in the
    dtypes of `hidden` and `weight`."""
    if chunks < 1:
        raise ValueError(f"loss chunks must be >= 1, got {chunks}")
    if hidden.dtype != weight.dtype:
        # One compute dtype for the matmuls (mixed precision casts both to param_dtype).
        raise TypeError(f"hidden is {hidden.dtype} but the head weight is {weight.dtype}")
    return _ChunkedLinearCrossEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), chunks
    )
