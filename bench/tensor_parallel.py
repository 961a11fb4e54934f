"""Benchmark: tensor-parallel plans beside torchtitan's published figures (not a test; run on demand).

    python bench/tensor_parallel.py

For Llama 3 70B on 256 H100 and Llama 3.1 405B on 512 and 1024 H100 at seq 8192, prints the
planner's prediction for the mesh torchtitan published (tp=8, full activation checkpointing, pinned
through the search space) and for the configuration the planner itself chooses, with the search's
CPU time. torchtitan's figures (docs/performance.md, benchmarks of 2024-12) come from 96 GB, 500 W
H100s with torch.compile and Float8 matmuls, and for 405B with 8-way pipeline parallelism, which
this planner does not plan: they are a yardstick for order of magnitude, not a measurement of the
same configuration. Results go to bench/RESULTS.md by hand.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

from planner.catalog.models import resolve_model
from planner.errors import InfeasiblePlanError
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    cluster: str
    sequences: int
    published: str
    """torchtitan's figure for the nearest configuration it published."""


SEQ_LEN = 8192
CASES = (
    Case("70B on 256 H100", "llama3-70b", "32x8xH100", 512,
         "FSDP 32 x TP 8, local batch 16, full AC, compile + Float8: 829 tok/s/GPU, 71.9 GiB"),
    Case("405B on 512 H100", "llama3.1-405b", "64x8xH100", 256,
         "FSDP 8 x TP 8 x PP 8, global batch 256, full AC, compile + Float8 + async TP: "
         "128 tok/s/GPU, 72.7 GiB"),
    Case("405B on 1024 H100 (16M tokens/step)", "llama3.1-405b", "128x8xH100", 2048, "none published"),
)


def _request(case: Case, search: SearchSpace) -> PlanRequest:
    return PlanRequest(
        model=resolve_model(case.model),
        cluster=ClusterSpec.parse(case.cluster),
        training=TrainingSpec(seq_len=SEQ_LEN, global_batch_tokens=case.sequences * SEQ_LEN),
        search=search,
    )


def _row(case: Case, what: str, search: SearchSpace) -> str:
    start = time.process_time()
    try:
        plan = make_plan(_request(case, search))
    except InfeasiblePlanError as exc:
        return f"| {case.label} | {what} | does not fit: {exc.message[:80]}... | | | | |"
    cpu_ms = (time.process_time() - start) * 1000
    p = plan.prediction
    return (
        f"| {case.label} | {what} | `{plan.config.label()}` | {p.tokens_per_s_per_gpu:,.0f} | "
        f"{p.mfu:.1%} | {p.peak_memory_gib:.1f} | {cpu_ms:,.0f} |"
    )


def main() -> None:
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print("| case | mesh | configuration | tok/s/GPU | MFU | peak GiB | search CPU ms |")
    print("|---|---|---|---:|---:|---:|---:|")
    for case in CASES:
        published = SearchSpace(tensor_parallel_degrees=[8], checkpointing=["full"], shardings=["full_shard"])
        print(_row(case, "torchtitan's: tp 8, full AC", published))
        print(_row(case, "searched", SearchSpace()))
    print()
    for case in CASES:
        print(f"- {case.label}: torchtitan {case.published}")


if __name__ == "__main__":
    main()
