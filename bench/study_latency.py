"""Benchmark: a what-if study end to end (not a test; run on demand).

    python bench/study_latency.py [--repeats 3]

Llama 3.1 405B on a 15T-token budget over 3 GPU types (H100, H200, A100) x 10 cluster sizes (8 to
4,096 GPUs, doubling): 30 full searches, planned in parallel in the service's search pool (one worker
per core) as `POST /api/v1/studies` and `fsdp-planner whatif` do, timed from submitting the study to
its summary, pool start included (a fresh pool per repeat). Goal on a 2-core machine: < 10 s median.
Also reports the same searches one after another in this process, for the speed-up.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

from api.services.search_pool import SearchPool, available_cores
from api.services.studies import run_study
from planner.catalog.models import resolve_model
from planner.errors import PlanningError
from planner.search import make_plan
from planner.study import StudyRequest

GOAL_S = 10.0


def the_study() -> StudyRequest:
    return StudyRequest(
        model=resolve_model("llama3.1-405b"), token_budget=15 * 10**12,
        gpus=[{"gpu": "H100"}, {"gpu": "H200"}, {"gpu": "A100"}],
        cluster_sizes={"min_gpus": 8, "max_gpus": 4096}, seq_len=8192, global_batch_tokens=16 * 2**20,
        deadline_days=400.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    study = the_study()
    candidates = study.candidates()
    print(f"{platform.processor() or platform.machine()}, {available_cores()} cores, "
          f"Python {platform.python_version()}")
    print(f"{study.model.name}: {len(study.gpus)} GPU types x {len(study.sizes())} sizes = {len(candidates)} "
          "candidates")

    parallel = []
    for _ in range(args.repeats):
        pool = SearchPool(workers=available_cores(), deadline_s=600.0)
        start = time.perf_counter()
        summary, _ = run_study(study, pool)
        parallel.append(time.perf_counter() - start)
        pool.shutdown()
    start = time.perf_counter()
    for candidate in candidates:
        if candidate.request is not None:
            with contextlib.suppress(PlanningError):  # a cluster that does not fit is an answer too
                make_plan(candidate.request, advise_other_clusters=False)  # as run_study plans them
    serial = time.perf_counter() - start
    median = statistics.median(parallel)
    fitting = sum(p.fits for p in summary.points)
    print(f"parallel ({available_cores()} workers): median {median:.2f} s of {args.repeats} "
          f"({', '.join(f'{t:.2f}' for t in parallel)}); {fitting} of {len(candidates)} fit")
    print(f"serial (one process): {serial:.2f} s; speed-up {serial / median:.2f}x")
    print(f"goal < {GOAL_S:.0f} s: {'met' if median < GOAL_S else 'MISSED'}")


if __name__ == "__main__":
    main()
