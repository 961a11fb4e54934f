"""The routed experts' grouped GEMM, timed beside the dense GEMM of the same work.

A mixture of experts runs its routed experts' projections as grouped GEMMs (`torch._grouped_mm`: rows
sorted by expert, every expert's own weight, one kernel). The planner prices them at a share of the
dense GEMM rate (`CostParameters.grouped_gemm_efficiency`); this measures that share on the device.
Each point is one projection at the model's expert shapes (w1 and w3: hidden -> expert width, w2 the
way back), at a count of experts per GPU (all of them, and the shares a few expert-parallel degrees
leave) and the rows per expert that a micro-batch's routed tokens give them, forward and backward
(input gradient, and the weight gradient: a K-grouped GEMM). Beside it, `torch.mm` of the same total
rows at the same widths: the same FLOPs as one dense GEMM, so that the ratio of the two times is the
grouped kernel's rate over the dense one.

Where torch has no `_grouped_mm`, or the device refuses it, nothing is timed and the profile says why.
Standard library and torch only, like the rest of the profiler.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from executor.profile.measure import DTYPE_NAMES, Budget, synchronize, time_call

EXPERT_PARALLEL_DEGREES = (1, 8, 64)
"""The experts per GPU timed are the model's experts over each of these degrees (where it divides
them): every expert on the GPU (FSDP alone), a node's share (expert parallelism over 8 GPUs), and the
share of 64 (DeepSeek-V3's degree), so that the rows per expert range from a micro-batch's fewest to
its most."""
ROW_ALIGNMENT = 16
"""Rows per expert are rounded up to a multiple of this, so that every group offset is aligned to 16
bytes or more in any dtype (the kernel's weight gradient contracts over the rows and asks it)."""
MAX_POINTS = 12
"""Points timed at most (projections x expert counts x micro-batches): a second or two on a GPU."""


def grouped_gemm_points(
    model: dict, *, seq_len: int, micro_batches: list[int]
) -> list[tuple[int, int, int, int]]:
    """(experts per GPU, rows per expert, n, k) of the model's routed expert projections: forward
    x [experts x rows, k] @ w [experts, k, n]. Empty for a dense model. Smallest work first."""
    moe = model.get("moe")
    if not moe:
        return []
    hidden, width = int(model["hidden_size"]), int(moe["expert_intermediate_size"])
    experts, top_k = int(moe["num_experts"]), int(moe["experts_per_token"])
    counts = sorted({experts // d for d in EXPERT_PARALLEL_DEGREES if experts % d == 0 and experts >= d})
    points = set()
    for mb in micro_batches:
        # A rank's routed rows are its tokens x top-k whatever the expert-parallel degree: the ep
        # group's tokens over its share of the experts.
        routed = mb * seq_len * top_k
        for count in counts:
            rows = -(-max(1, routed // count) // ROW_ALIGNMENT) * ROW_ALIGNMENT
            points.add((count, rows, width, hidden))  # w1 and w3
            points.add((count, rows, hidden, width))  # w2
    return sorted(points, key=lambda p: (p[0] * p[1] * p[2] * p[3], p))[:MAX_POINTS]


def grouped_mm_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `torch._grouped_mm` cannot be timed here (None when a tiny forward and backward run)."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    try:
        x = torch.randn(4 * ROW_ALIGNMENT, 16, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(2, 16, 16, device=device, dtype=dtype, requires_grad=True)
        offsets = torch.tensor([2 * ROW_ALIGNMENT, 4 * ROW_ALIGNMENT], device=device, dtype=torch.int32)
        out = torch._grouped_mm(x, w, offs=offsets)
        torch.autograd.grad(out, (x, w), torch.randn_like(out))
        synchronize(device)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"torch._grouped_mm does not run on {device.type} in {DTYPE_NAMES[dtype]}: {first_line[:300]}"
    return None


def _forward_backward(
    forward: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...], device: torch.device
) -> tuple[float, float]:
    """Median seconds of `forward` alone, and of its backward (every input's gradient) alone."""
    with torch.no_grad():
        forward_s = time_call(forward, device)
    out = forward()
    grad = torch.randn_like(out)  # a real tensor: an expanded one (of .sum()) is no layout a GEMM takes
    backward_s = time_call(lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), device)
    return forward_s, backward_s


def _grouped(x: torch.Tensor, experts: int, rows: int, n: int, device: torch.device) -> tuple[float, float]:
    """The grouped GEMM's forward and backward seconds; its weights are freed on return (all of a
    large model's experts are the largest tensors a point holds)."""
    # The runtime's layout (executor/runtime/models/moe.py GroupedExperts): [experts, in, out].
    w = torch.randn(experts, x.shape[1], n, device=device, dtype=x.dtype, requires_grad=True)
    offsets = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * rows
    return _forward_backward(lambda: torch._grouped_mm(x, w, offs=offsets), (x, w), device)


def grouped_gemm_sample(
    experts: int, rows: int, n: int, k: int, *, dtype: torch.dtype, device: torch.device
) -> dict:
    """One point: the grouped GEMM's forward and backward, and the dense GEMM's of the same rows."""
    x = torch.randn(experts * rows, k, device=device, dtype=dtype, requires_grad=True)
    grouped = _grouped(x, experts, rows, n, device)
    w = torch.randn(k, n, device=device, dtype=dtype, requires_grad=True)
    dense = _forward_backward(lambda: torch.mm(x, w), (x, w), device)
    return {
        "experts": experts,
        "rows": rows,
        "n": n,
        "k": k,
        "dtype": DTYPE_NAMES[dtype],
        "forward_seconds": grouped[0],
        "backward_seconds": grouped[1],
        "dense_forward_seconds": dense[0],
        "dense_backward_seconds": dense[1],
    }


def grouped_gemm_profile(
    model: dict | None,
    *,
    seq_len: int,
    micro_batches: list[int],
    device: torch.device,
    budget: Budget,
    on_sample: Callable[[str], None] = lambda _: None,
) -> dict | None:
    """The profile's `grouped_gemm` section: None for a dense model (nothing to time); else the timed
    points, smallest first until the budget ends, or none and `not_measured` saying why. bf16 on a GPU
    (the grouped kernel's dtype, the one the runtime's experts run it in), fp32 on CPU."""
    points = grouped_gemm_points(model or {}, seq_len=seq_len, micro_batches=micro_batches)
    if not points:
        return None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    problem = grouped_mm_problem(device, dtype)
    if problem is not None:
        return {"samples": [], "not_measured": problem}
    samples: list[dict] = []
    failures: list[str] = []
    for experts, rows, n, k in points:
        if budget.exhausted:
            break
        try:
            samples.append(grouped_gemm_sample(experts, rows, n, k, dtype=dtype, device=device))
        except torch.OutOfMemoryError:
            # All experts of a large model on one GPU may not fit beside their gradient: the smaller
            # shares still say what the kernel achieves.
            failures.append(f"{experts} experts x {rows} rows ({k} -> {n}) ran out of memory")
        except RuntimeError as exc:
            failures.append(f"{experts} experts x {rows} rows ({k} -> {n}): {str(exc).strip()[:200]}")
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        on_sample(f"grouped GEMM {experts} experts x {rows} rows, {k} -> {n}")
    if samples:
        return {"samples": samples, "not_measured": None}
    reason = failures[0] if failures else "the time budget ended before the first grouped GEMM"
    return {"samples": [], "not_measured": reason[:500]}
