"""Realistic rows for the pages that show data other services upload: calibration profiles and
validation runs, inserted through the ORM (the upload endpoints are not what these tests are about)."""

from __future__ import annotations

import random
from typing import Any

from sqlalchemy.orm import Session

from api.db.models import CalibrationProfileRow, PlanRow, ValidationRunRow
from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import resolve_model
from planner.cost.parameters import default_parameters
from planner.specs import ClusterSpec

H100_BF16_PEAK = 989.4e12


def h100_profile(name: str = "8x H100 node a17") -> CalibrationProfile:
    """What `fsdp-planner calibrate` measures on one 8 x H100 node: GEMMs approach ~70% of peak as they
    grow, collectives approach ~370 GB/s bus bandwidth past a few MiB, latency-bound below."""
    matmul = []
    for size in (256, 512, 1024, 2048, 4096, 8192):
        for dtype, peak in (("bfloat16", H100_BF16_PEAK), ("float32", 66.9e12)):
            flops = 2.0 * size * size * size
            matmul.append({"m": size, "n": size, "k": size, "dtype": dtype,
                           "seconds": 8e-6 + flops / (peak * 0.72)})
    collectives = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        for exponent in range(10, 31, 2):  # 1 KiB .. 1 GiB
            size = 1 << exponent
            passes = 2 if op == "all_reduce" else 1
            seconds = passes * (14e-6 + size * 7 / 8 / 370e9)
            collectives.append(
                {"op": op, "group_size": 8, "link": "intra", "bytes": size, "seconds": seconds}
            )
    profile = {
        "name": name,
        "gpu": "H100",
        "fingerprint": {
            "device_name": "NVIDIA H100 80GB HBM3", "device_count": 8, "num_nodes": 1, "gpus_per_node": 8,
            "backend": "nccl", "link_class": "NV18", "torch_version": "2.13.0", "cuda_version": "12.8",
            "nccl_version": "2.27.3",
        },
        "model": resolve_model("llama3-8b").model_dump(mode="json"),
        "matmul": matmul,
        "memory_bandwidth": [{"bytes": 1 << 30, "seconds": (1 << 30) / 2.9e12}],
        "collectives": collectives,
        "blocks": [
            {"model": "llama3-8b", "micro_batch_size": mb, "seq_len": 8192, "checkpointing": "none",
             "compile": True, "dtype": "bfloat16", "seconds": 0.0215 * mb, "peak_memory_bytes": mb * 3 << 30}
            for mb in (1, 2)
        ],
        "overlap_contention": 0.07,
        # What mem_get_info reports on an H100 80GB after CUDA and NCCL start: 79.1 of 79.6 GiB.
        "usable_memory_bytes": 84_935_000_000,
        "device_memory_bytes": 85_520_809_984,
    }
    return CalibrationProfile.model_validate(profile)


def insert_calibration(session: Session, profile: CalibrationProfile) -> CalibrationProfileRow:
    """Stored as the calibration upload stores it: fingerprint, document, fitted parameters per precision."""
    gpu = resolve_gpu(profile.gpu or "cpu")
    fp = profile.fingerprint
    cluster = ClusterSpec(num_nodes=fp.num_nodes, gpus_per_node=fp.gpus_per_node, gpu=gpu.name)
    fitted: dict[str, Any] = {}
    for precision in ("bf16", "fp32"):
        base = default_parameters(gpu, cluster, precision)
        fitted[precision] = fit_parameters(profile, base=base, precision=precision).as_document()
        fitted[f"{precision}_catalog"] = base.as_document()
    row = CalibrationProfileRow(
        name=profile.name or fp.device_name, fingerprint=fp.model_dump(mode="json"),
        profile=profile.model_dump(mode="json"), fitted_parameters=fitted,
    )
    session.add(row)
    session.commit()
    return row


def _error_pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100  # the runs API's definition


def insert_runs(session: Session, plan: PlanRow, count: int, seed: int = 0) -> list[ValidationRunRow]:
    """`count` runs of `plan` measuring within about ±15% of its prediction."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        step = plan.step_time_s * rng.uniform(0.88, 1.18)
        tokens = plan.tokens_per_s_per_gpu * plan.step_time_s / step
        memory = plan.peak_memory_gib * rng.uniform(0.9, 1.08)
        row = ValidationRunRow(
            plan_id=plan.id, measured_step_time_s=step, measured_tokens_per_s_per_gpu=tokens,
            measured_peak_memory_gib=memory, predicted_step_time_s=plan.step_time_s,
            predicted_tokens_per_s_per_gpu=plan.tokens_per_s_per_gpu,
            predicted_peak_memory_gib=plan.peak_memory_gib,
            step_time_error_pct=_error_pct(plan.step_time_s, step),
            tokens_per_s_error_pct=_error_pct(plan.tokens_per_s_per_gpu, tokens),
            peak_memory_error_pct=_error_pct(plan.peak_memory_gib, memory), raw={"steps": 20},
        )
        session.add(row)
        rows.append(row)
    session.commit()
    return rows
