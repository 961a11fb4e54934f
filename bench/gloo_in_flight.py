"""Benchmark: dozens of all-gathers in flight on gloo, as a compiled SimpleFSDP step issues them (not a test).

    python bench/gloo_in_flight.py [--backend gloo|runtime] [--iterations 2000] [--in-flight 40] [--serial]

Two CPU ranks (torchrun, gloo) repeat what a compiled full_shard or shard_grad_op forward does on a
CPU job: issue `--in-flight` functional all-gathers (`_c10d_functional.all_gather_into_tensor`, the
op torch.compile's graphs call) of llama-debug's shard shapes at once, then wait for each in turn
while the main thread allocates and frees beside gloo's worker threads. `--backend gloo` is torch's
default process group (two worker threads); `--backend runtime` is the one a bundle's CPU ranks use
(`executor.runtime.distributed.cpu_backend`: one worker thread). `--serial` waits for each all-gather
before issuing the next. Prints progress every 200 iterations, and how the ranks ended: a heap
corruption shows as `malloc(): ...` and SIGABRT on one rank with a connection reset on the other.
No compile and no model: only torch's collectives.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from executor.runtime.distributed import cpu_backend  # noqa: E402 (the repo on the path first)

SHARD_SHAPES = ((1024, 256), (128,), (128, 768), (384, 256), (384, 256), (128,), (128, 256), (64, 256))
"""One llama-debug block's parameter shards on 2 ranks (plus the embedding's), as the compiled
forward gathers them."""


def worker(args: argparse.Namespace) -> None:
    faulthandler.enable(all_threads=True)
    dist.init_process_group(cpu_backend() if args.backend == "runtime" else "gloo")
    rank, group = dist.get_rank(), dist.group.WORLD.group_name
    threads = dist.group.WORLD._get_backend(torch.device("cpu")).options._threads
    shards = [torch.randn(shape) for shape in (SHARD_SHAPES * args.in_flight)[: args.in_flight]]
    collectives = torch.ops._c10d_functional
    start = time.monotonic()
    if rank == 0:
        print(f"backend {dist.get_backend()} ({threads} worker thread(s)), {args.in_flight} all-gathers "
              f"{'one at a time' if args.serial else 'in flight'}, {args.iterations} iterations", flush=True)
    for iteration in range(1, args.iterations + 1):
        gathered = []
        for shard in shards:
            full = collectives.all_gather_into_tensor.default(shard, 2, group)
            gathered.append(collectives.wait_tensor.default(full) if args.serial else full)
        for full in gathered:
            full = collectives.wait_tensor.default(full)
            # The main thread allocates and frees beside gloo's threads, as the compiled graph does.
            torch.randn(full.shape[0] * 2, *full.shape[1:])
        if rank == 0 and iteration % 200 == 0:
            print(f"iteration {iteration}: {time.monotonic() - start:.0f} s", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"all {args.iterations} iterations passed in {time.monotonic() - start:.0f} s", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "runtime"), default="gloo")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=40)
    parser.add_argument("--serial", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               __file__, "--worker", "--backend", args.backend, "--iterations", str(args.iterations),
               "--in-flight", str(args.in_flight), *(["--serial"] if args.serial else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = (result.stdout + result.stderr).splitlines()
    keep = ("backend ", "iteration", "iterations passed", "malloc(", "free(", "corrupted", "Fatal Python",
            "exitcode")
    print("\n".join(line for line in lines if any(k in line for k in keep)))
    print(f"exit {result.returncode}")


if __name__ == "__main__":
    main()
