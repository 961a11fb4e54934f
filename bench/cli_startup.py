"""Benchmark: the CPU time `fsdp-planner` commands cost from start to exit (not a test; run on demand).

    python bench/cli_startup.py [--runs 5]

Each case runs the installed console script (the entry point in pyproject.toml) in a fresh process, RUNS
times after one warm-up; a run's CPU time is its user + system seconds from the operating system's
accounting of the finished child, so a loaded machine moves it far less than wall time. Issue 42's goals
(medians): `--help` < 0.3 s, a llama3-8b plan < 0.6 s, a 405B plan on 1,024 GPUs < 1.3 s; issue 40's:
deepseek-v3 on 256 H100s plans (with expert parallelism) in < 2 s. `--only TEXT` times the cases whose
name contains TEXT; `--mode cached|none` one way of starting.

Two ways Python starts: with a bytecode cache (as an installed package runs: pip compiles it, and an
editable checkout writes __pycache__; here a temporary PYTHONPYCACHEPREFIX that the warm-up fills), and
without one for the project (PYTHONDONTWRITEBYTECODE=1 in a checkout without __pycache__, as the
development shells here run: every start compiles the project's sources; the libraries' caches are read).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = shutil.which("fsdp-planner") or str(Path(sys.executable).with_name("fsdp-planner"))

CASES: dict[str, tuple[list[str], float | None]] = {
    "fsdp-planner --help": (["--help"], 0.3),
    "plan --help": (["plan", "--help"], None),
    "plan llama3-8b on 1x8xH100": (
        ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "8192",
         "--global-batch-tokens", "131072"],
        0.6,
    ),
    "plan llama3.1-405b on 128x8xH100": (
        ["plan", "--model", "llama3.1-405b", "--cluster", "128x8xH100", "--seq-len", "8192",
         "--global-batch-tokens", "16777216"],
        1.3,
    ),
    "plan deepseek-v3 on 32x8xH100": (
        ["plan", "--model", "deepseek-v3", "--cluster", "32x8xH100", "--seq-len", "4096",
         "--global-batch-tokens", "16777216"],
        2.0,
    ),
    "plan qwen3-30b-a3b on 1x8xH100 (pure bf16)": (
        ["plan", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--seq-len", "4096",
         "--global-batch-tokens", "1048576", "--state-dtype", "bfloat16"],
        None,
    ),
}
"""Each case: the arguments after `fsdp-planner`, and its goal in seconds of CPU (median; None: none set)."""


def cpu_seconds(*, script: str, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One run's (CPU, wall) seconds: the child's user + system time, read from the children's usage."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run([script, *args], capture_output=True, check=False, env=env)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{args} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="", help="time only the cases whose name contains this")
    parser.add_argument("--mode", choices=("cached", "none"), help="time only this way of starting")
    parser.add_argument("--script", default=SCRIPT,
                        help="the command to time (another tree's entry point, for a before-and-after)")
    options = parser.parse_args()
    runs = options.runs
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}; {runs} runs each after one warm-up")
    print("| command | bytecode | median CPU s | min CPU s | max CPU s | median wall s | goal |")
    print("|---|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="cli-startup-pyc-") as cache:
        plain = {key: value for key, value in os.environ.items()
                 if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        modes = {"cached": {**plain, "PYTHONPYCACHEPREFIX": cache},
                 "none": {**plain, "PYTHONDONTWRITEBYTECODE": "1"}}
        for name, (args, goal) in CASES.items():
            if options.only not in name:
                continue
            for mode, env in modes.items():
                if options.mode not in (None, mode):
                    continue
                cpu_seconds(script=options.script, args=args, env=env)
                timings = [cpu_seconds(script=options.script, args=args, env=env) for _ in range(runs)]
                cpus = [cpu for cpu, _ in timings]
                median = statistics.median(cpus)
                verdict = "-" if goal is None else f"< {goal} s: {'met' if median < goal else 'missed'}"
                print(f"| {name} | {mode} | {median:.2f} | {min(cpus):.2f} | {max(cpus):.2f} | "
                      f"{statistics.median(wall for _, wall in timings):.2f} | {verdict} |", flush=True)


if __name__ == "__main__":
    main()
