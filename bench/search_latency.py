"""Benchmark: full planner search latency (not a test; run on demand).

    python bench/search_latency.py [--repeats 7]

Times `make_plan` for Llama 3 8B on 1x8 H100, Llama 3.1 405B on 128x8 H100 (1024 GPUs) and a
maximal traced layer graph (1,024 units, the API's default limit: an embedding, 1,022 identical
blocks, a head) on 4x8 H100, and the two llama cases again at 128k-token sequences, where context
parallelism is searched too; the 405B cases, on 128 nodes, search pipeline parallelism as well
(pp 1-16 with every schedule); reports the median wall-clock and CPU time (the process's own, which
other work on a shared machine barely moves) and candidates evaluated per second. Goals on a 2-core
machine: < 100 ms for 8B on 8 GPUs, < 1 s for the rest (median wall clock).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from planner.catalog.models import resolve_model
from planner.search import make_plan
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec

MAXIMAL_GRAPH = ModelSpec(
    name="traced-1024",
    architecture="layer_graph",
    layer_graph=[
        {"name": "embed", "num_params": 50_000_000, "fwd_flops_per_token": 0,
         "activation_bytes_per_token": 8192, "is_block": False},
        *({"name": f"layers.{i}", "num_params": 1_000_000, "fwd_flops_per_token": 4e7,
           "activation_bytes_per_token": 4096} for i in range(1022)),
        {"name": "head", "num_params": 50_000_000, "fwd_flops_per_token": 1e8,
         "activation_bytes_per_token": 8192, "is_block": False},
    ],
)

CASES = {
    "llama3-8b on 1x8xH100 (seq 8192, 16 seqs/step)": ("llama3-8b", "1x8xH100", 8192, 16, 0.100),
    "llama3.1-405b on 128x8xH100 (seq 4096, 2048 seqs/step)": (
        "llama3.1-405b",
        "128x8xH100",
        4096,
        2048,
        1.0,
    ),
    "traced graph of 1,024 units on 4x8xH100 (seq 4096, 128 seqs/step)": (
        MAXIMAL_GRAPH, "4x8xH100", 4096, 128, 1.0,
    ),
    # Context parallelism in the space (sequences of 32k tokens or more): pp x cp x tp x sharding.
    "llama3-8b on 1x8xH100 (seq 131072, 1 seq/step; cp searched)": (
        "llama3-8b", "1x8xH100", 131072, 1, 0.100,
    ),
    "llama3.1-405b on 128x8xH100 (seq 131072, 64 seqs/step; cp searched)": (
        "llama3.1-405b", "128x8xH100", 131072, 64, 1.0,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| case | median ms | min ms | median CPU ms | candidates | fitting | candidates/s | goal |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, (model, cluster, seq_len, sequences, goal_s) in CASES.items():
        request = PlanRequest(
            model=model if isinstance(model, ModelSpec) else resolve_model(model),
            cluster=ClusterSpec.parse(cluster),
            training=TrainingSpec(seq_len=seq_len, global_batch_tokens=seq_len * sequences),
        )
        make_plan(request)  # warm imports and caches outside the timing
        times, cpu = [], []
        for _ in range(args.repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            plan = make_plan(request)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        median = statistics.median(times)
        rate = plan.search.candidates_evaluated / median
        verdict = "met" if median < goal_s else "MISSED"
        print(
            f"| {label} | {median * 1e3:.1f} | {min(times) * 1e3:.1f} | {statistics.median(cpu) * 1e3:.1f} | "
            f"{plan.search.candidates_evaluated} | "
            f"{plan.search.candidates_fitting} | {rate:,.0f} | < {goal_s * 1e3:.0f} ms: {verdict} |"
        )


if __name__ == "__main__":
    main()
