"""The routed experts' grouped matmul: rows sorted by expert, times each expert's own weight.

On CUDA with bf16 (sm90+, aligned widths) it is `torch._grouped_mm`, which takes the group sizes as
an offsets tensor: no host sync, and torch.compile traces it into the graph. Elsewhere (CPU, fp32,
older GPUs) it is one matmul per expert over its rows, the exact FLOPs, wrapped as a custom operator
(`fsdp_planner::grouped_mm_loop`, with its backward's weight gradient a second one): its group
sizes are read to the host inside the operator, so the compiler sees an opaque op of static output
shape [tokens, d_out] and the model still compiles into one graph (`fullgraph=True`), where a plain
loop over data-dependent splits would break it.
"""

from __future__ import annotations

import torch


def grouped_mm_available(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `torch._grouped_mm` can run x [tokens, d_in] @ w [experts, d_in, d_out] here: CUDA
    (sm90+), bf16, and rows 16-byte aligned (its kernel's requirement)."""
    return (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device) >= (9, 0)
        and w.shape[-1] % 8 == 0
        and w.shape[-2] % 8 == 0
    )


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """x [tokens, d_in], its rows sorted by expert with `counts[e]` rows for expert e, times each
    expert's w[e] [d_in, d_out]: [tokens, d_out]."""
    if grouped_mm_available(x, w):
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        return torch._grouped_mm(x, w, offs=offsets)
    return grouped_mm_loop(x, w, counts)


@torch.library.custom_op("fsdp_planner::grouped_mm_loop", mutates_args=())
def grouped_mm_loop(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """One matmul per expert over its own rows."""
    pieces = torch.split(x, counts.tolist())
    return torch.cat([piece @ w[e] for e, piece in enumerate(pieces)])


@grouped_mm_loop.register_fake
def _(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[-1])


@torch.library.custom_op("fsdp_planner::grouped_mm_loop_weight_grad", mutates_args=())
def grouped_mm_loop_weight_grad(x: torch.Tensor, grad: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each expert's weight gradient [experts, d_in, d_out]: its rows' inputs transposed times their
    output gradients (zero for an expert without rows)."""
    sizes = counts.tolist()
    inputs, grads = torch.split(x, sizes), torch.split(grad, sizes)
    return torch.stack([a.transpose(0, 1) @ g for a, g in zip(inputs, grads, strict=True)])


@grouped_mm_loop_weight_grad.register_fake
def _(x: torch.Tensor, grad: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(counts.shape[0], x.shape[1], grad.shape[1])


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, w, counts = inputs
    ctx.save_for_backward(x, w, counts)


def _backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
    x, w, counts = ctx.saved_tensors
    grad_x = grouped_mm_loop(grad, w.transpose(-1, -2), counts) if ctx.needs_input_grad[0] else None
    grad_w = grouped_mm_loop_weight_grad(x, grad, counts) if ctx.needs_input_grad[1] else None
    return grad_x, grad_w, None


grouped_mm_loop.register_autograd(_backward, setup_context=_setup_context)
