"""Measurements at the very edges of what the API accepts (planner/bounds.py), for the API and dashboard
tests: every value here must be stored, fitted, planned with and drawn without a 500."""

from __future__ import annotations

from typing import Any

from planner.bounds import (
    MAX_BYTES_PER_S,
    MAX_FLOPS_PER_S,
    MAX_MEMORY_GIB,
    MAX_SECONDS,
    MAX_TOKENS_PER_S,
    MIN_KERNEL_SECONDS,
    MIN_MEMORY_GIB,
    MIN_STEP_SECONDS,
    MIN_TOKENS_PER_S,
)
from planner.calibration import MAX_DEVICE_BYTES
from planner.catalog.models import resolve_model

EXTREME_RUNS: list[dict[str, Any]] = [
    {"measured_step_time_s": MIN_STEP_SECONDS, "measured_tokens_per_s_per_gpu": MAX_TOKENS_PER_S,
     "measured_peak_memory_gib": MIN_MEMORY_GIB},
    {"measured_step_time_s": MAX_SECONDS, "measured_tokens_per_s_per_gpu": MIN_TOKENS_PER_S,
     "measured_peak_memory_gib": MAX_MEMORY_GIB},
    {"measured_step_time_s": 1.0, "measured_tokens_per_s_per_gpu": 1.0},
]
"""Completed runs at the bounds: the fastest and slowest steps, the smallest and largest peaks."""


def extreme_profile(**overrides: Any) -> dict[str, Any]:
    """A CPU CalibrationProfile whose every sample sits on a bound, with degenerate groups: one point,
    sizes all equal, a GEMM at 100 PFLOP/s, a copy and a collective at 100 TB/s, 11-day timings."""
    biggest_gemm = 4096
    matmul = [
        {"m": 1, "n": 1, "k": 1, "dtype": "float32", "seconds": MIN_KERNEL_SECONDS},
        {"m": 1, "n": 1, "k": 1, "dtype": "float32", "seconds": MAX_SECONDS},
        {"m": biggest_gemm, "n": biggest_gemm, "k": biggest_gemm, "dtype": "float32",
         "seconds": 2 * biggest_gemm**3 / MAX_FLOPS_PER_S},
    ] + [  # bf16: one size only, three timings (no spread to fit a line through)
        {"m": 64, "n": 64, "k": 64, "dtype": "bfloat16", "seconds": s} for s in (1e-5, 2e-5, 3e-5)
    ]
    collectives = [
        {"op": "all_gather", "group_size": 2, "link": "intra", "bytes": 1, "seconds": MIN_KERNEL_SECONDS},
        {"op": "all_gather", "group_size": 2, "link": "intra", "bytes": 10**12, "seconds": MAX_SECONDS},
        {"op": "all_gather", "group_size": 2, "link": "intra", "bytes": 10**12,
         "seconds": 10**12 / 2 / MAX_BYTES_PER_S},
        {"op": "reduce_scatter", "group_size": 2, "link": "inter", "bytes": 1 << 20, "seconds": MAX_SECONDS},
    ] + [
        {"op": "all_reduce", "group_size": 2, "link": "intra", "bytes": 1 << 20, "seconds": s}
        for s in (1e-4, 1e-4, 1e-4)
    ]
    model = resolve_model("llama-debug").model_dump(mode="json")
    steps = [
        {"num_layers": 1, "micro_batch_size": 1, "seq_len": 16, "ranks": 2, "dtype": "float32",
         "seconds": MIN_STEP_SECONDS, "update_seconds": MIN_KERNEL_SECONDS,
         "peak_allocated_bytes": 1, "peak_reserved_bytes": 1},
        {"num_layers": 2, "micro_batch_size": 1, "seq_len": 16, "ranks": 2, "dtype": "float32",
         "seconds": MAX_SECONDS, "update_seconds": MAX_SECONDS,
         "peak_allocated_bytes": MAX_DEVICE_BYTES, "peak_reserved_bytes": MAX_DEVICE_BYTES},
        {"num_layers": 2, "micro_batch_size": 1, "seq_len": 16, "ranks": 2, "dtype": "float32",
         "compile": True, "seconds": 1.0, "update_seconds": 0.5},
    ]
    profile = {
        "name": "extreme box", "gpu": "cpu",
        "fingerprint": {"device_name": "cpu", "device_count": 2, "gpus_per_node": 2, "backend": "gloo",
                        "torch_version": "2.13.0"},
        "model": model,
        "matmul": matmul,
        "memory_bandwidth": [{"bytes": 1, "seconds": MAX_SECONDS},
                             {"bytes": 10**12, "seconds": 10**12 / MAX_BYTES_PER_S}],
        "collectives": collectives,
        "blocks": [
            {"model": "llama-debug", "micro_batch_size": 1, "seq_len": 16, "seconds": s}
            for s in (MIN_KERNEL_SECONDS, MAX_SECONDS)
        ],
        "steps": steps,
        "overlap_contention": 2.0,
    }
    return {**profile, **overrides}
