"""Chunked output projection + cross-entropy vs the plain loss on full logits: peak memory and time.

    python bench/chunked_loss.py                                  # CPU, fp32, vocab 32000 and 128256
    python bench/chunked_loss.py --device cuda --dtype bfloat16   # a GPU session

Measures the loss part of a step only: final hidden states [tokens, hidden] and the head weight in,
forward + backward out (loss, hidden and weight gradients). `plain` is what train_step did before
`loss_chunks` (`F.cross_entropy((h @ W.T).float(), targets)`); `k slices` is
`executor.runtime.loss.chunked_linear_cross_entropy(..., chunks=k)`.

Peak memory is the allocation peak above the inputs during forward + backward: on CUDA the
allocator's max_memory_allocated, on CPU the running sum of the profiler's allocation events (the
trainer's MemoryMeter reading). The gradients of the inputs are included (both ways pay them).
The per-slice cost B (bytes per slice-token x vocab-word alive at the peak of one slice) is the
least-squares slope of the chunked peaks against slice_tokens x vocab, measured on a probe with a
narrow hidden size (`--probe-hidden`), so that the weight-sized buffers (the fp32 weight-gradient
accumulator, the per-slice weight-gradient share in bf16, the gradients kept for backward) stay
far below the slice's logits and the peak is inside a slice for every chunk count. That B is what
the planner prices; the main table shows what the whole loss costs at the real width.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.runtime.loss import chunked_linear_cross_entropy  # noqa: E402
from executor.runtime.metrics import _peak_net_allocation, _quiet_stdout  # noqa: E402

GIB = 2**30
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def plain(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((h @ w.t()).float(), t)


def chunked(chunks: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    return lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunks=chunks)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fwd_bwd(fn: Callable, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> None:
    h.grad = w.grad = None
    fn(h, w, t).backward()


def peak_bytes(fn: Callable, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> int:
    """Allocation peak above what is live before the call (inputs), gradients included."""
    h.grad = w.grad = None
    if h.device.type == "cuda":
        synchronize(h.device)
        base = torch.cuda.memory_allocated(h.device)
        torch.cuda.reset_peak_memory_stats(h.device)
        fwd_bwd(fn, h, w, t)
        synchronize(h.device)
        return torch.cuda.max_memory_allocated(h.device) - base
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stdout(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fwd_bwd(fn, h, w, t)
    peak = _peak_net_allocation(prof)
    if peak is None:
        raise RuntimeError("this torch's profiler gives no memory events")
    return peak


def seconds(fn: Callable, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, *, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        synchronize(h.device)
        t0 = time.perf_counter()
        fwd_bwd(fn, h, w, t)
        synchronize(h.device)
        times.append(time.perf_counter() - t0)
    return min(times)  # the machine may be shared: the fastest run is the least disturbed


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--chunks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs after the profiled one (min)")
    parser.add_argument("--compile", action="store_true", help="torch.compile (inductor) each variant")
    parser.add_argument("--probe-hidden", type=int, default=64, help="hidden size of the B probe")
    parser.add_argument("--probe-chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    tokens = args.batch * args.seq_len
    torch.manual_seed(0)
    print(
        f"# {platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, {args.dtype}, "
        f"{args.batch} x {args.seq_len} tokens, hidden {args.hidden}{', compiled' if args.compile else ''}"
    )
    print("| vocab | loss | slice tokens | peak GiB | vs plain | fwd+bwd s | vs plain |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for vocab in args.vocab:
        h = torch.randn(tokens, args.hidden, device=device).to(dtype).requires_grad_()
        w = (torch.randn(vocab, args.hidden, device=device) * args.hidden**-0.5).to(dtype).requires_grad_()
        t = torch.randint(0, vocab, (tokens,), device=device)
        variants: list[tuple[str, int, Callable]] = [("plain", tokens, plain)]
        variants += [(f"{k} slices", math.ceil(tokens / k), chunked(k)) for k in args.chunks]
        base_peak = base_time = 0.0
        for label, slice_tokens, fn in variants:
            if args.compile:
                torch._dynamo.reset()
                fn = torch.compile(fn, fullgraph=True)
                fwd_bwd(fn, h, w, t)  # compile outside the measurement
            peak = peak_bytes(fn, h, w, t)
            secs = seconds(fn, h, w, t, repeats=args.repeats)
            if label == "plain":
                base_peak, base_time = peak, secs
            print(
                f"| {vocab} | {label} | {slice_tokens} | {peak / GIB:.3f} | {peak / base_peak:.2f}x | "
                f"{secs:.2f} | {secs / base_time:.2f}x |",
                flush=True,
            )
        del h, w, t
    for vocab in args.vocab:
        b, fixed = per_slice_bytes(
            vocab,
            tokens=tokens,
            hidden=args.probe_hidden,
            chunks=args.probe_chunks,
            device=device,
            dtype=dtype,
        )
        print(
            f"# vocab {vocab}: B = {b:.2f} bytes per slice-token x vocab-word (probe: hidden "
            f"{args.probe_hidden}, slices {args.probe_chunks}; the rest {fixed / 2**20:.1f} MiB)",
            flush=True,
        )


def per_slice_bytes(
    vocab: int, *, tokens: int, hidden: int, chunks: list[int], device: torch.device, dtype: torch.dtype
) -> tuple[float, float]:
    """(B, intercept in bytes): the slope of the chunked loss's peak against slice_tokens x vocab."""
    h = torch.randn(tokens, hidden, device=device).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device) * hidden**-0.5).to(dtype).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=device)
    xs = [math.ceil(tokens / k) * vocab for k in chunks]
    ys = [peak_bytes(chunked(k), h, w, t) for k in chunks]
    b = slope(xs, ys)
    return b, statistics.fmean(ys) - b * statistics.fmean(xs)


if __name__ == "__main__":
    main()
