"""Micro-benchmarks for calibration: GEMMs, memory bandwidth, collectives, and comm/compute overlap.

Each function returns plain dicts shaped like the planner's CalibrationProfile samples, so the
profile can be written with `json` alone. Every sweep stops early when its time budget runs out:
a profile with fewer points is still a valid profile, only a coarser one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from executor.profile.device import float8_gemm_dtype

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}
# torch 2.13 renamed the tensor collectives and warns (FutureWarning) on every call of the old names;
# older torch (bundles run on >= 2.6) has only the old ones.
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Budget:
    """Wall-clock allowance for one phase of the profile."""

    seconds: float
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def exhausted(self) -> bool:
        return time.perf_counter() - self.started >= self.seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, *, repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of `fn`, synchronising the device around every call."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def agreed_seconds(seconds: float, device: torch.device, group: dist.ProcessGroup | None = None) -> float:
    """The slowest rank's time: a collective step is as slow as its slowest member."""
    if not dist.is_initialized():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def agreed_exhausted(budget: Budget, device: torch.device) -> bool:
    """Whether any rank's budget has run out: ranks about to run collectives must stop together,
    or one would wait forever for the others."""
    stop = torch.tensor([1.0 if budget.exhausted else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    return stop.item() > 0


def matmul_samples(
    shapes: Iterable[tuple[int, int, int]],
    dtypes: Iterable[torch.dtype],
    device: torch.device,
    budget: Budget,
    on_sample: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """Time (m x k) @ (k x n) for each shape and dtype, smallest first, until the budget ends."""
    samples = []
    for dtype in dtypes:
        for m, n, k in sorted(set(shapes), key=lambda s: s[0] * s[1] * s[2]):
            if budget.exhausted:
                return samples
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            seconds = time_call(lambda a=a, b=b: torch.mm(a, b), device)
            samples.append({"m": m, "n": n, "k": k, "dtype": DTYPE_NAMES[dtype], "seconds": seconds})
            on_sample(f"matmul {m}x{k}x{n} {DTYPE_NAMES[dtype]}")
            del a, b
    return samples


def float8_matmul_samples(
    shapes: Iterable[tuple[int, int, int]],
    device: torch.device,
    budget: Budget,
    on_sample: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """Time the tensorwise-scaled float8 GEMM (what torchao's tensorwise recipe runs: e4m3 operands, one
    scale each, bf16 out) for each shape, smallest first, until the budget ends; none where the device
    has no float8 tensor cores. Shapes whose sides are not multiples of 16 are skipped (the kernel
    refuses them, and the planner's filter never converts such layers)."""
    fp8 = float8_gemm_dtype(device)  # e4m3; on MI300-series GPUs its fnuz encoding
    if fp8 is None:
        return []
    name = str(fp8).removeprefix("torch.")
    samples = []
    one = torch.ones((), device=device, dtype=torch.float32)
    for m, n, k in sorted(set(shapes), key=lambda s: s[0] * s[1] * s[2]):
        if budget.exhausted:
            break
        if m % 16 or n % 16 or k % 16:
            continue
        a = torch.randn(m, k, device=device).to(fp8)
        b = torch.randn(n, k, device=device).to(fp8).t()  # column-major, as cuBLASLt and hipBLASLt want
        seconds = time_call(
            lambda a=a, b=b: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            device,
        )
        samples.append({"m": m, "n": n, "k": k, "dtype": name, "seconds": seconds})
        on_sample(f"matmul {m}x{k}x{n} {name}")
        del a, b
    return samples


def bandwidth_samples(sizes_bytes: Iterable[int], device: torch.device, budget: Budget) -> list[dict]:
    """Time copies of growing buffers; bytes counts the read and the write."""
    samples = []
    for size in sorted(sizes_bytes):
        if budget.exhausted:
            break
        src = torch.empty(size // 4, dtype=torch.float32, device=device).uniform_()
        dst = torch.empty_like(src)
        seconds = time_call(lambda src=src, dst=dst: dst.copy_(src), device)
        samples.append({"bytes": 2 * src.numel() * 4, "seconds": seconds})
        del src, dst
    return samples


def collective_samples(
    *,
    group: dist.ProcessGroup | None,
    member: bool,
    group_size: int,
    link: str,
    sizes_bytes: Iterable[int],
    device: torch.device,
    budget: Budget,
    on_sample: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """An all-gather, a reduce-scatter (one flat tensor each) and an all-reduce over growing messages.

    `bytes` is the whole (unsharded) tensor, as the planner prices collectives. `group` None is the
    whole world. Every rank of the world calls this (`member` False for ranks outside `group`, which
    only keep in step), because the stop decision is agreed collectively.
    """
    samples = []
    for size in sorted(sizes_bytes):
        if agreed_exhausted(budget, device):
            break
        if not member:
            dist.barrier()
            continue
        numel = max(group_size, size // 4 // group_size * group_size)
        full = torch.empty(numel, dtype=torch.float32, device=device).uniform_()
        shard = torch.empty(numel // group_size, dtype=torch.float32, device=device)
        ops = {
            "all_gather": lambda full=full, shard=shard: all_gather_tensor(
                full, shard, group=group
            ),
            "reduce_scatter": lambda full=full, shard=shard: reduce_scatter_tensor(
                shard, full, group=group
            ),
            "all_reduce": lambda full=full: dist.all_reduce(full, group=group),
        }
        for op, fn in ops.items():
            seconds = agreed_seconds(time_call(fn, device, repeats=5, warmup=1), device, group)
            samples.append(
                {"op": op, "group_size": group_size, "link": link, "bytes": numel * 4, "seconds": seconds}
            )
        on_sample(f"collectives n={group_size} {link} {numel * 4 >> 10} KiB")
        del full, shard
        dist.barrier()
    return samples


def overlap_contention(device: torch.device, *, matmul_size: int, message_bytes: int) -> float | None:
    """How much slower a GEMM loop runs while an all-gather runs beside it (0.1 = 10%)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    world = dist.get_world_size()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(matmul_size, matmul_size, device=device, dtype=dtype)
    numel = max(world, message_bytes // 4 // world * world)
    full = torch.empty(numel, device=device)
    shard = torch.empty(numel // world, device=device)

    def compute() -> None:
        for _ in range(8):
            torch.mm(a, a)

    def with_comm() -> None:
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            with torch.cuda.stream(stream):
                work = all_gather_tensor(full, shard, async_op=True)
            compute()
            work.wait()
        else:
            work = all_gather_tensor(full, shard, async_op=True)
            compute()
            work.wait()

    alone = time_call(compute, device)
    dist.barrier()
    together = time_call(with_comm, device)
    comm = time_call(lambda: all_gather_tensor(full, shard), device)
    # The overlapped run takes at least as long as the longer of the two; what exceeds that is the
    # compute slowdown, expressed relative to the overlapped span.
    overlapped = min(alone, comm)
    slowdown = max(0.0, together - max(alone, comm)) / overlapped if overlapped > 0 else 0.0
    return float(agreed_seconds(min(slowdown, 2.0), device))
