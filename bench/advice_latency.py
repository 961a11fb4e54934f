"""Benchmark: how long a refused request takes to answer with its advice (not a test; run on demand).

    python bench/advice_latency.py [--repeats 5]

Times `make_plan` on requests that fit nowhere (its search, then planner/infeasibility.py bisecting node
counts for a cluster and batch the planner accepts) and on a batch that does not split (refused by
the search's pre-check, whose suggestions are checked against memory). Goal on a 2-core machine:
< 1 s median, the same as a 405B search on 1024 GPUs (bench/search_latency.py).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

from planner.catalog.models import resolve_model
from planner.errors import PlanningError
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec

GOAL_S = 1.0

DATA_PARALLEL = SearchSpace(tensor_parallel_degrees=[1], context_parallel_degrees=[1])
"""Cases that tensor or context parallelism plans on the cluster asked for are refused without them
(context parallelism, searched from 32k tokens, plans the 70B case as asked)."""
CASES = {
    "405B on 1x8 H100, seq 4096: smallest cluster + batch":
        ("llama3.1-405b", "1x8xH100", 4096, 1024, SearchSpace()),
    "405B on 16x8 H100, seq 8192, tp 1: nothing fits up to 4096 nodes":
        ("llama3.1-405b", "16x8xH100", 8192, 1024, DATA_PARALLEL),
    "70B on 4x8 H100, seq 32768, tp 1: fits where activations dominate":
        ("llama3-70b", "4x8xH100", 32768, 64, DATA_PARALLEL),
    "405B on 33x8 H100, 1024 seqs: batch that does not split":
        ("llama3.1-405b", "33x8xH100", 4096, 1024, SearchSpace()),
}


def refusal(model: str, cluster: str, seq_len: int, sequences: int, search: SearchSpace) -> Callable[[], str]:
    """A call that builds and plans the request and returns the refusal's message."""

    def run() -> str:
        try:
            request = PlanRequest(
                model=resolve_model(model),
                cluster=ClusterSpec.parse(cluster),
                training=TrainingSpec(seq_len=seq_len, global_batch_tokens=seq_len * sequences),
                search=search,
            )
            make_plan(request)
        except PlanningError as exc:  # nothing fits, or the batch does not split
            return exc.message
        raise AssertionError(f"{model} on {cluster} was planned; the benchmark wants a refusal")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print("| refused request | median ms | min ms | goal |")
    print("|---|---:|---:|---|")
    for label, case in CASES.items():
        run = refusal(*case)
        run()  # warm imports and caches outside the timing
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        verdict = "met" if median < GOAL_S else "MISSED"
        goal = f"< {GOAL_S * 1e3:.0f} ms: {verdict}"
        print(f"| {label} | {median * 1e3:.0f} | {min(times) * 1e3:.0f} | {goal} |")


if __name__ == "__main__":
    main()
