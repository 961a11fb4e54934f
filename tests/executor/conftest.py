"""Helpers for executor tests: run torchrun jobs on CPU (gloo) and make plans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def explain(result: subprocess.CompletedProcess[str], tail: int = 6000) -> str:
    out, err = result.stdout[-tail:], result.stderr[-tail:]
    return f"exit {result.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


@pytest.fixture
def write_plan(tmp_path: Path):
    """Write a plan document to a temp file and return its path."""

    def write(document: dict, name: str = "plan.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(document))
        return path

    return write
