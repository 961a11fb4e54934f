"""Out-of-memory: know where training is, recognise an allocation failure, and leave one clear record.

A run that runs out of memory is a result, not a crash: the record (step, phase, allocator state,
the bytes asked for, the plan) is what lets `fsdp-planner validate` store it as an OOM run and the
service re-plan the request without configurations at least as memory-hungry.

CUDA raises `torch.OutOfMemoryError`; the CPU allocator raises a plain `RuntimeError`
("DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"), so both are matched.
Every rank that fails appends its own line to the metrics file (one `write` on an O_APPEND file
descriptor, so lines from several ranks do not interleave on a local file system).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

EXIT_OOM = 3
"""Exit status of a trainer process that ran out of memory (2 is a user error, 1 anything else)."""

GIB = 1024.0**3

_CPU_ALLOCATOR_MESSAGE = "DefaultCPUAllocator: can't allocate memory"
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
# CUDA: "Tried to allocate 7.83 GiB"; CPU: "you tried to allocate 140737488355328 bytes".
_CUDA_REQUEST = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)\b")
_CPU_REQUEST = re.compile(r"tried to allocate (\d+) bytes")


class PhaseTracker:
    """Where the trainer is: the step and the phase (setup, forward, backward, optimizer, ...), and
    what an OOM record needs to name the run (rank, device, plan, memory cap).

    Updated by the training loop and `train_step`, read only when something fails.
    """

    __slots__ = ("device", "memory_limit_bytes", "phase", "plan_hash", "rank", "step")

    def __init__(self) -> None:
        self.phase = "setup"
        self.step: int | None = None
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.device = torch.device("cpu")
        self.plan_hash = ""
        self.memory_limit_bytes: int | None = None

    def enter(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        if step is not None:
            self.step = step


def find_oom(exc: BaseException) -> BaseException | None:
    """The allocation failure behind `exc` (itself, or a cause wrapped by DCP, compile, ...), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, torch.OutOfMemoryError):
            return current
        if isinstance(current, RuntimeError) and _CPU_ALLOCATOR_MESSAGE in str(current):
            return current
        current = current.__cause__ or current.__context__
    return None


def requested_bytes(message: str) -> int | None:
    """The size of the allocation that failed, when the allocator's message names it."""
    match = _CUDA_REQUEST.search(message)
    if match:
        return round(float(match.group(1)) * _UNITS[match.group(2)])
    match = _CPU_REQUEST.search(message)
    return int(match.group(1)) if match else None


@dataclass(slots=True)
class OomRecord:
    """The metrics-file line of a rank that ran out of memory (`"event": "oom"`)."""

    step: int | None
    """The optimizer step being run (None: before the first step)."""
    phase: str
    rank: int
    device: str
    plan_hash: str
    requested_bytes: int | None
    allocated_bytes: int | None
    """CUDA allocator: bytes held by tensors when the failure was caught (None on CPU)."""
    reserved_bytes: int | None
    """CUDA allocator: bytes reserved from the driver (None on CPU)."""
    max_allocated_bytes: int | None
    """CUDA allocator: the highest allocation of the step so far (None on CPU)."""
    memory_limit_bytes: int | None
    """The cap set with --max-memory-gib, if any."""
    message: str
    event: str = "oom"

    def describe(self) -> str:
        """One line for people."""
        where = f"step {self.step}" if self.step is not None else "before the first step"
        parts = [f"OUT OF MEMORY on rank {self.rank} ({self.device}) at {where} ({self.phase})"]
        if self.requested_bytes is not None:
            parts.append(f"tried to allocate {self.requested_bytes / GIB:.2f} GiB")
        if self.allocated_bytes is not None and self.reserved_bytes is not None:
            allocated, reserved = self.allocated_bytes / GIB, self.reserved_bytes / GIB
            parts.append(f"{allocated:.2f} GiB allocated, {reserved:.2f} GiB reserved")
        if self.memory_limit_bytes is not None:
            parts.append(f"limit {self.memory_limit_bytes / GIB:.2f} GiB (--max-memory-gib)")
        return "; ".join(parts)


def oom_record(exc: BaseException, tracker: PhaseTracker) -> OomRecord:
    device = tracker.device
    message = " ".join(str(exc).split())  # one line: CUDA's message spans several
    allocated = reserved = peak = None
    if device.type == "cuda":
        try:
            allocated = torch.cuda.memory_allocated(device)
            reserved = torch.cuda.memory_reserved(device)
            peak = torch.cuda.max_memory_allocated(device)
        except RuntimeError:  # a broken context after the failure: the message still says enough
            pass
    return OomRecord(
        step=tracker.step,
        phase=tracker.phase,
        rank=tracker.rank,
        device=str(device),
        plan_hash=tracker.plan_hash,
        requested_bytes=requested_bytes(message),
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        max_allocated_bytes=peak,
        memory_limit_bytes=tracker.memory_limit_bytes,
        message=message[:2000],
    )


def report_oom(record: OomRecord, metrics_file: Path | None) -> None:
    """Append the record to the metrics file (every failing rank) and print one line to stderr."""
    if metrics_file is not None:
        line = json.dumps({**asdict(record), "time": time.time()}) + "\n"
        try:
            metrics_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(metrics_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:  # the stderr line below still reports the failure
            print(f"warning: cannot write the OOM record to {metrics_file}: {exc}", file=sys.stderr)
    print(f"error: {record.describe()}", file=sys.stderr, flush=True)


def limit_cuda_memory(device: torch.device, gib: float) -> int:
    """Cap this process's CUDA allocations at `gib` GiB (rehearse a plan for a smaller GPU).

    Returns the cap in bytes. Raises ValueError when the cap exceeds the device.
    """
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(gib * GIB)
    if cap > total:
        raise ValueError(f"--max-memory-gib {gib:g} is more than this GPU has ({total / GIB:.1f} GiB)")
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    return cap
