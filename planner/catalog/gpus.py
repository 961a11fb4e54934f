"""Accelerator catalog: datasheet peaks that the uncalibrated cost model starts from.

Bandwidths are per GPU and per direction in GB/s (1e9 bytes/s); FLOP/s are dense (no sparsity).
Memory is what the runtime can allocate, in GiB.
"""

from __future__ import annotations

import re

from planner.errors import UnknownCatalogEntryError
from planner.gpu_spec import GpuSpec

_H100_SXM = GpuSpec(
    name="H100-SXM-80GB",
    aliases=("H100", "H100-SXM", "H100-80GB"),
    memory_gib=79.6,
    peak_bf16_tflops=989.4,
    peak_fp32_tflops=66.9,
    peak_fp8_tflops=1978.9,
    memory_bandwidth_gbps=3350,
    intra_node_bandwidth_gbps=450,
    inter_node_bandwidth_gbps=50,
    nominal_memory_gb=80,
    board_power_w=700,
    matmul_efficiency=0.801,
    attention_efficiency=0.35,
    chip="GH100",
    sm_count=132,
)

GPU_CATALOG: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        _H100_SXM,
        # The same die and peaks with six HBM2e stacks, in Meta's Grand Teton servers (torchtitan's
        # and torchao's H100 benchmarks): more memory, less bandwidth, and a lower default power
        # limit (torchtitan's benchmark docs: "96GB HBM2e, 2.4 TB/s, default 500W power limit").
        # 95.0 GiB is what torchtitan's logs show free to allocate.
        GpuSpec.model_validate({
            **_H100_SXM.model_dump(),
            "name": "H100-SXM-96GB",
            "aliases": ("H100-96GB", "H100-HBM2e"),
            "memory_gib": 95.0,
            "memory_bandwidth_gbps": 2400,
            "nominal_memory_gb": 96,
            "power_limit_w": 500,
        }),
        GpuSpec(
            name="H200-141GB",
            aliases=("H200",),
            memory_gib=140.4,
            peak_bf16_tflops=989.4,
            peak_fp32_tflops=66.9,
            peak_fp8_tflops=1978.9,
            memory_bandwidth_gbps=4800,
            intra_node_bandwidth_gbps=450,
            inter_node_bandwidth_gbps=50,
            nominal_memory_gb=141,
            board_power_w=700,
            matmul_efficiency=0.803,
            attention_efficiency=0.35,
            chip="GH100",
            sm_count=132,
        ),
        GpuSpec(
            name="A100-80GB",
            aliases=("A100", "A100-SXM-80GB"),
            memory_gib=79.2,
            peak_bf16_tflops=312.0,
            peak_fp32_tflops=19.5,
            memory_bandwidth_gbps=2039,
            intra_node_bandwidth_gbps=300,
            inter_node_bandwidth_gbps=25,
            nominal_memory_gb=80,
            board_power_w=400,
            matmul_efficiency=0.859,
            attention_efficiency=0.6,
            chip="GA100",
            sm_count=108,
        ),
        GpuSpec(
            name="A100-40GB",
            aliases=("A100-SXM-40GB",),
            memory_gib=39.4,
            peak_bf16_tflops=312.0,
            peak_fp32_tflops=19.5,
            memory_bandwidth_gbps=1555,
            intra_node_bandwidth_gbps=300,
            inter_node_bandwidth_gbps=25,
            nominal_memory_gb=40,
            board_power_w=400,
            matmul_efficiency=0.859,
            attention_efficiency=0.6,
            chip="GA100",
            sm_count=108,
        ),
        GpuSpec(
            name="L4",
            aliases=("L4-24GB",),
            memory_gib=22.0,
            peak_bf16_tflops=121.0,
            peak_fp32_tflops=30.3,
            memory_bandwidth_gbps=300,
            intra_node_bandwidth_gbps=25,
            inter_node_bandwidth_gbps=12.5,
            nominal_memory_gb=24,
            board_power_w=72,
            chip="AD104",
            sm_count=58,
        ),
        GpuSpec(
            name="B200",
            aliases=("B200-180GB",),
            memory_gib=178.0,
            peak_bf16_tflops=2250.0,
            peak_fp32_tflops=75.0,
            peak_fp8_tflops=4500.0,
            mx_formats=True,
            memory_bandwidth_gbps=8000,
            intra_node_bandwidth_gbps=900,
            inter_node_bandwidth_gbps=50,
            nominal_memory_gb=180,
            board_power_w=1000,
            matmul_efficiency=0.776,
            attention_efficiency=0.35,
            chip="GB100",
            sm_count=148,
        ),
        # A CPU "device" (one rank per core group, gloo over shared memory): lets plans and
        # launchers be exercised on machines without GPUs. Calibration replaces these guesses.
        GpuSpec(
            name="cpu",
            aliases=("CPU",),
            memory_gib=8.0,
            peak_bf16_tflops=0.1,
            peak_fp32_tflops=0.1,
            memory_bandwidth_gbps=20,
            intra_node_bandwidth_gbps=2,
            inter_node_bandwidth_gbps=1.25,
            default_gpus_per_node=2,
            matmul_efficiency=0.8,
        ),
    )
}

_BY_LOWER_NAME = {key.lower(): gpu for gpu in GPU_CATALOG.values() for key in (gpu.name, *gpu.aliases)}


def resolve_gpu(name: str) -> GpuSpec:
    """The catalog entry for a GPU name or alias, case-insensitively."""
    gpu = _BY_LOWER_NAME.get(name.strip().lower())
    if gpu is None:
        known = ", ".join(sorted(GPU_CATALOG))
        raise UnknownCatalogEntryError(
            f"unknown GPU {name!r}; known GPUs: {known} (aliases such as H100 and A100 work too)",
            field="cluster.gpu",
        )
    return gpu


def gpu_for_device(device_name: str) -> GpuSpec | None:
    """The catalog GPU a device reports itself as (`torch.cuda.get_device_name`), or None.

    `NVIDIA H100 80GB HBM3` is H100-SXM-80GB, `NVIDIA A100-SXM4-40GB` is A100-40GB, `cpu (x86_64)` is
    cpu: a catalog family (the name up to its first dash) must be a whole word of the device name, so
    that `NVIDIA L40S` is not an L4. Where a family has several sizes, a size written in the device
    name picks one; otherwise the family's first entry (the one its short alias names) is taken.
    """
    words = {word for word in re.split(r"[^a-z0-9]+", device_name.lower()) if word}
    matches = [gpu for gpu in GPU_CATALOG.values() if gpu.name.split("-")[0].lower() in words]
    sized = [gpu for gpu in matches if words & {part.lower() for part in gpu.name.split("-")[1:]}]
    return (sized or matches or [None])[0]
