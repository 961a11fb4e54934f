"""Benchmark: the compiled llama-debug bundle run with evaluation, repeated on a loaded machine (not a test).

    python bench/launcher_eval_repeats.py [--runs 20] [--burners 2] [--steps 40] [--eval-every 20]
                                          [--cold-cache] [--out DIR]

Issue 38 item 11: tried as a new user would (`fsdp-planner plan`, `fsdp-planner launcher`,
`SYNTHETIC_DATA=1 ./launch.sh --steps 40 --eval-every 20` on 2 CPU ranks, machine loaded), 1 run in 4
died at the step-20 evaluation with `malloc(): unaligned tcache chunk detected` (SIGABRT on rank 1).
This renders that bundle the same way, then runs it `--runs` times beside `--burners` processes spinning
on the CPU, and reports each run's exit status, wall time, evaluation losses and any heap-corruption
message. `--cold-cache` gives every run an empty inductor cache (a fresh machine's first run compiles
everything); by default the runs share one cache, as a user's reruns do.

The cause, found later (bench/gloo_in_flight.py, bench/RESULTS.md "CPU ranks' heap corruption"): torch's
gloo with two worker threads corrupts the heap when many all-gathers are in flight; every CPU group of a
job now runs gloo with one worker thread (executor/runtime/distributed.py). This bench is the user's-eye
check of that fix.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HEAP_MESSAGES = ("malloc(", "free(", "corrupted", "double free", "tcache", "SIGABRT", "Signal 6")
PLAN_ARGS = ["--model", "llama-debug", "--cluster", "1x2xcpu", "--seq-len", "64",
             "--global-batch-tokens", "512", "--precision", "fp32"]
BURNER = "while True: pass"


def render_bundle(work: Path) -> Path:
    """The README's launcher example: a plan, then its torchrun bundle (as a user runs them)."""
    cli = [sys.executable, "-m", "api.cli.main"]
    subprocess.run([*cli, "plan", *PLAN_ARGS, "-o", str(work / "plan.json")], check=True, capture_output=True)
    subprocess.run([*cli, "launcher", "--plan", str(work / "plan.json"), "--target", "torchrun", "-o",
                    str(work / "bundles")], check=True, capture_output=True)
    (bundle,) = [p for p in (work / "bundles").iterdir() if p.is_dir()]
    return bundle


def one_run(bundle: Path, *, steps: int, eval_every: int, cache: Path, log: Path) -> dict[str, object]:
    env = {**os.environ, "SYNTHETIC_DATA": "1", "PYTHON": sys.executable,
           "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    metrics = log.with_suffix(".jsonl")
    metrics.unlink(missing_ok=True)
    start = time.monotonic()
    with log.open("w") as out:
        result = subprocess.run(
            [str(bundle / "launch.sh"), "--steps", str(steps), "--eval-every", str(eval_every),
             "--metrics-file", str(metrics)],
            cwd=bundle, env=env, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=1800,
        )
    text = log.read_text(errors="replace")
    evals = [line.split("eval loss")[1].split()[0] for line in text.splitlines() if "eval loss" in line]
    heap = sorted({m for m in HEAP_MESSAGES if m in text})
    return {"rc": result.returncode, "wall_s": time.monotonic() - start, "evals": evals, "heap": heap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--cold-cache", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' logs here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eval-repeats-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    bundle = render_bundle(work)
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; bundle {bundle.name}; "
          f"{args.burners} burners; launch.sh --steps {args.steps} --eval-every {args.eval_every}; "
          f"{'cold' if args.cold_cache else 'shared'} inductor cache")
    print("| run | exit | wall s | load (1 min) | eval losses | heap messages |")
    print("|---:|---:|---:|---:|---|---|")
    spinning = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(args.burners)]
    failures = 0
    try:
        for run in range(1, args.runs + 1):
            cache = work / (f"inductor-{run}" if args.cold_cache else "inductor")
            r = one_run(bundle, steps=args.steps, eval_every=args.eval_every, cache=cache,
                        log=out / f"run-{run:02d}.log")
            failures += r["rc"] != 0
            print(f"| {run} | {r['rc']} | {r['wall_s']:.0f} | {os.getloadavg()[0]:.1f} | "
                  f"{', '.join(r['evals'])} | {', '.join(r['heap']) or '-'} |", flush=True)
    finally:
        for burner in spinning:
            burner.kill()
            burner.wait()
    print(f"{args.runs - failures} of {args.runs} runs passed; logs in {out}")


if __name__ == "__main__":
    main()
