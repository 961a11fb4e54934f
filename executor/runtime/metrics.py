"""Per-step metrics: JSON lines for machines, one progress line for people (rank 0 writes both).

Peak memory: on GPU, `torch.cuda.max_memory_reserved` over the step (reset every step): what the
caching allocator took from the device, which is what the plan predicts and what runs out; the
allocated peak is recorded beside it (`peak_allocated_gib`). On CPU
there is no allocator high-water mark, so selected steps run under the torch profiler with memory
recording: peak = tensors alive at the step's start (parameters, optimizer state, buffers) + the
highest net allocation of the training thread during the step (gloo's worker threads stand where
NCCL's buffers do on a GPU: outside what the plan prices). Steps in between carry the last measurement. If the
profiler is unavailable the process's peak resident set size is reported instead (an upper bound
that includes the interpreter and compiler); `memory_source` names which one a record holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

GIB = 1024.0**3


@dataclass(slots=True)
class StepMetrics:
    """One line of the metrics file."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    peak_memory_gib: float | None
    memory_source: str
    tokens_seen: int
    peak_allocated_gib: float | None = None
    """GPU only: the allocated (not reserved) peak of the step."""
    eval_loss: float | None = None
    """Mean loss on the held-out split, on the steps that evaluated (`--eval-every`); else null."""
    eval_time_s: float | None = None
    """Seconds the evaluation took (not part of step_time_s)."""
    synthetic_data: bool = False
    """True when the run trains on synthetic tokens (`--synthetic-data`): a rehearsal, not training."""


def mfu(tokens_per_s_per_gpu: float, *, flops_per_token: float | None, peak_tflops: float) -> float | None:
    """Model FLOPs utilisation against the plan GPU's dense bf16 peak (None when unknown)."""
    if not flops_per_token or peak_tflops <= 0:
        return None
    return tokens_per_s_per_gpu * flops_per_token / (peak_tflops * 1e12)


def _local_bytes(t: torch.Tensor) -> int:
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def persistent_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of this rank's parameters, buffers, gradients and optimizer state."""
    total = sum(_local_bytes(p) for p in model.parameters())
    total += sum(_local_bytes(b) for b in model.buffers())
    total += sum(_local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    if optimizer is not None:
        for state in optimizer.state.values():
            total += sum(_local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total


class MemoryMeter:
    """Measures a step's peak memory on this rank (see the module docstring)."""

    def __init__(self, device: torch.device, *, cpu_every: int = 25) -> None:
        self.device = device
        self.cpu_every = cpu_every
        self.last_gib: float | None = None
        self.last_allocated_gib: float | None = None
        self.source = "cuda_max_reserved" if device.type == "cuda" else "cpu_tensor_profile"

    def _cpu_due(self, step: int, first_step: int) -> bool:
        # Not the first step of a run: it is dominated by compilation and lazy initialisation.
        since = step - first_step
        return since == 1 or (self.cpu_every > 0 and since > 1 and since % self.cpu_every == 1)

    @contextlib.contextmanager
    def measure(
        self, step: int, *, first_step: int, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            self.last_gib = torch.cuda.max_memory_reserved(self.device) / GIB
            self.last_allocated_gib = torch.cuda.max_memory_allocated(self.device) / GIB
            return
        if not self._cpu_due(step, first_step) or self.source == "cpu_rss":
            yield
            return
        base = persistent_bytes(model, optimizer)
        try:
            from torch.profiler import ProfilerActivity, profile

            prof_cm = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        except Exception:  # pragma: no cover - profiler not built in
            prof_cm = None
        if prof_cm is None:
            yield
            self._fallback_rss()
            return
        with _quiet_stdout():  # kineto prints start/stop banners from C++
            prof = prof_cm.__enter__()
        try:
            yield
        finally:
            with _quiet_stdout():
                prof_cm.__exit__(None, None, None)
        peak = _peak_net_allocation(prof)
        if peak is None:
            self._fallback_rss()
        else:
            self.last_gib = (base + peak) / GIB

    def _fallback_rss(self) -> None:
        import resource

        self.source = "cpu_rss"
        # ru_maxrss is KiB on Linux.
        self.last_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence file descriptors 1 and 2 (C++ prints bypass sys.stdout) for the duration of the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(os.devnull, "wb") as devnull:
            for fd in saved:
                os.dup2(devnull.fileno(), fd)
            yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def _peak_net_allocation(prof: Any) -> int | None:
    """Highest net allocation of a profiled step (bytes): the training thread's, or every thread's
    when the profiler's event tree cannot be read; None if neither can."""
    try:
        return training_thread_peak(prof)
    except Exception:  # the event tree is not public API and changes between releases
        return all_threads_peak(prof)


def all_threads_peak(prof: Any) -> int | None:
    """Highest running sum of CPU allocation events (bytes) in a profile, or None if unreadable."""
    try:
        events = prof.profiler.kineto_results.events()
        allocations = sorted(
            (e.start_ns(), e.nbytes())
            for e in events
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        )
    except Exception:  # the profiler's event API is not public and changes between releases
        return None
    running = peak = 0
    for _, nbytes in allocations:
        running += nbytes
        peak = max(peak, running)
    return peak


def training_thread_peak(prof: Any) -> int:
    """Highest net allocation of tensors allocated on the training thread (wherever freed).

    gloo's worker threads allocate temporaries of their own (a reduce-scatter copies its input), and
    when they run relative to the training thread varies from step to step; NCCL's buffers on a GPU
    lie outside PyTorch's allocator, so what a GPU's allocator sees is the training thread's share.
    The training thread is the one that allocates most often.
    """
    from torch._C._profiler import _EventType

    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            fields = event.extra_fields
            allocations.append((event.start_time_ns, event.start_tid, fields.ptr, fields.alloc_size))
    allocations.sort()
    counts: dict[int, int] = {}
    for _, tid, _, size in allocations:
        counts[tid] = counts.get(tid, 0) + (size > 0)
    main = max(counts, key=counts.__getitem__, default=0)
    owner: dict[int, int] = {}
    running = peak = 0
    for _, tid, ptr, size in allocations:
        if size > 0:
            owner[ptr] = tid
        elif owner.pop(ptr, main) != main:
            continue
        if size < 0 or tid == main:
            running += size
            peak = max(peak, running)
    return peak


class MetricsWriter:
    """Appends StepMetrics as JSON lines and prints a progress line (rank 0 only)."""

    def __init__(
        self, path: Path | None, *, enabled: bool, total_steps: int, stream: IO[str] = sys.stdout
    ) -> None:
        self.enabled = enabled
        self.total_steps = total_steps
        self.stream = stream
        self.file = None
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("a", encoding="utf-8")

    def log(self, m: StepMetrics) -> None:
        if not self.enabled:
            return
        if self.file is not None:
            self.file.write(json.dumps({**asdict(m), "time": time.time()}) + "\n")
            self.file.flush()
        mem = f"{m.peak_memory_gib:.2f} GiB" if m.peak_memory_gib is not None else "n/a"
        util = f"{100 * m.mfu:.1f}%" if m.mfu is not None else "n/a"
        # Step time in seconds, like the closing summary: a large model's step lasts minutes, which in
        # milliseconds reads "486854 ms". (The runtime imports nothing of ours: no planner.formatting.)
        evaluated = ""
        if m.eval_loss is not None:
            evaluated = f" | eval loss {m.eval_loss:.4f}" + (
                f" ({m.eval_time_s:.3g} s)" if m.eval_time_s is not None else ""
            )
        print(
            f"step {m.step}/{self.total_steps} | loss {m.loss:.4f} | grad norm {m.grad_norm:.3f} | "
            f"lr {m.lr:.2e} | {m.step_time_s:.4g} s | {m.tokens_per_s_per_gpu:,.0f} tok/s/gpu | "
            f"mfu {util} | mem {mem}{evaluated}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
