"""Helpers for executor tests: run torchrun jobs on CPU (gloo) and make plans."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from planner.plan import Plan
from tests.executor.torchtitan_plans import llama3_8b_plan, llama3_70b_tp_pp_plan

REPO = Path(__file__).resolve().parents[2]
SLOW_BF16 = 8.0
"""bf16 matrix products this many times slower than fp32 ones make a bf16 training test impractical."""


def job_env(**extra: str) -> dict[str, str]:
    """Environment for a CPU job: the repo importable, one thread per rank (2 cores, 2-4 ranks)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
        # Compile-time only: scalar C++ kernels compile ~40% faster on this 2-core machine; the
        # graphs, collectives and bucketing passes under test are the same.
        TORCHINDUCTOR_VEC_ISA_OK="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def torchrun(
    nproc: int, args: list[str], *, timeout: float = 420, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc-per-node N <args>` (a free rendezvous port per job)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *args,
    ]
    return subprocess.run(
        cmd, cwd=cwd, env=env or job_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


@functools.cache
def bf16_slowdown() -> float:
    """How many times slower this CPU multiplies bf16 matrices than fp32 ones, on one thread as each
    rank runs: about 1-2 with AVX512-BF16 or AMX, about 60 on a CPU with AVX2 alone, where torch falls
    back to scalar bf16 kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.ones(256, 256, dtype=dtype), torch.ones(256, 256, dtype=dtype)
            a @ b  # warm-up
            start = time.perf_counter()
            for _ in range(3):
                a @ b
            seconds[dtype] = time.perf_counter() - start
        return seconds[torch.bfloat16] / seconds[torch.float32]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def fast_bf16() -> None:
    """Skips a test that trains a bf16 model of some size where this CPU has no native bf16."""
    slowdown = bf16_slowdown()
    if slowdown > SLOW_BF16:
        pytest.skip(
            f"this CPU multiplies bf16 matrices {slowdown:.0f}x slower than fp32 (torch reports "
            f"{torch.backends.cpu.get_cpu_capability()}: no AVX512-BF16 or AMX), so this test's bf16 "
            "training steps would take many minutes; it runs on CPUs with native bf16"
        )


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


FATAL_MARKERS = ("Fatal Python error", "malloc(", "free(", "corrupted", "double free", "Segmentation fault",
                 "Aborted", "exitcode", "Signal ", "terminate called")
"""Lines that say how a rank died: kept whole in a failure's message, where a peer's long traceback (a
connection reset by the dead rank) would push them out of the stderr tail."""


def explain(result: subprocess.CompletedProcess[str], tail: int = 6000) -> str:
    out, err = result.stdout[-tail:], result.stderr[-tail:]
    fatal = [line for line in result.stderr.splitlines() if any(m in line for m in FATAL_MARKERS)]
    deaths = "\n--- how ranks died ---\n" + "\n".join(fatal[:40]) if fatal else ""
    return f"exit {result.returncode}{deaths}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


@pytest.fixture
def write_plan(tmp_path: Path):
    """Write a plan document to a temp file and return its path."""

    def write(document: dict, name: str = "plan.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(document))
        return path

    return write


@pytest.fixture(scope="module")
def plan_8b() -> Plan:
    """The torchtitan target's llama3-8b plan (tests/executor/torchtitan_plans.py)."""
    return llama3_8b_plan()


@pytest.fixture(scope="module")
def plan_70b() -> Plan:
    """The torchtitan target's 70B TP+PP plan (tests/executor/torchtitan_plans.py)."""
    return llama3_70b_tp_pp_plan()
