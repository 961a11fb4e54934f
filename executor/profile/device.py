"""What the profiled device is, on CUDA and on ROCm builds of torch alike.

A ROCm build of torch runs the same profiling code: `torch.cuda` is HIP there (device type `cuda`,
backend `nccl` = RCCL), but `torch.version.cuda` is None and `torch.version.hip` names the runtime,
`get_device_capability` reports the GCN architecture's numbers (gfx942 reads as 9.4, which is no CUDA
capability), and the float8 GEMM takes the `fnuz` encoding on MI300-series GPUs. This module answers
those questions once for the profiler: the runtime's versions, the catalog GPU the device is, and the
float8 GEMM it runs (if any). Standard library and torch only, like the rest of the profiler.
"""

from __future__ import annotations

import os
import re

import torch

from executor.runtime.float8 import ROCM_FLOAT8, architecture, device_supports, is_rocm

KNOWN_GPUS: tuple[tuple[str, str], ...] = (
    ("gb300", "GB300"),
    ("gb200", "GB200"),
    ("b300", "B300"),
    ("b200", "B200"),
    ("h200", "H200-141GB"),
    ("h800", "H800"),
    ("h20", "H20"),
    ("h100", "H100-SXM-80GB"),
    ("a100", "A100-80GB"),
    ("l40s", "L40S"),
    ("l4", "L4"),
    ("mi355x", "MI355X"),
    ("mi325x", "MI325X"),
    ("mi300x", "MI300X"),
)
"""A word of the device's name (`torch.cuda.get_device_name`, lowercased) and the catalog GPU it names,
in the order they are tried. Whole words, so that `NVIDIA L40S` is no L4 and `NVIDIA GB200` no B200."""
AMD_ARCHITECTURES: dict[str, tuple[tuple[float, str], ...]] = {
    "gfx942": ((200.0, "MI300X"), (float("inf"), "MI325X")),
    "gfx950": ((float("inf"), "MI355X"),),
}
"""Instinct GPUs by their architecture (`gcnArchName`) and memory (GiB, at most): what a ROCm device
whose name is blank or unfamiliar (a virtual function, an OEM name) is. MI300X and MI325X share the
gfx942 die; 192 GB against 256 GB tells them apart."""


def runtime_versions() -> dict[str, str | None]:
    """The GPU runtime torch was built for: `cuda_version` (None on ROCm) and `hip_version`."""
    return {"cuda_version": torch.version.cuda, "hip_version": getattr(torch.version, "hip", None)}


def allocator_config() -> str:
    """The caching allocator's settings this process runs under ('' for torch's defaults): on a ROCm
    build `PYTORCH_HIP_ALLOC_CONF` where it is set (the HIP allocator reads it first), else
    `PYTORCH_CUDA_ALLOC_CONF`."""
    hip = os.environ.get("PYTORCH_HIP_ALLOC_CONF") if is_rocm() else None
    return hip if hip is not None else os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def catalog_gpu(device: torch.device) -> str | None:
    """The catalog GPU this device is: `cpu` for CPU ranks; else the first of KNOWN_GPUS whose word
    is a word of the device's name, or on ROCm the Instinct GPU of its architecture and memory; None
    when neither names one (the service then asks for the GPU by name)."""
    if device.type != "cuda":
        return "cpu"
    words = set(re.split(r"[^a-z0-9]+", torch.cuda.get_device_name(device).lower()))
    named = next((gpu for word, gpu in KNOWN_GPUS if word in words), None)
    if named is not None:
        return named
    arch = architecture(device)
    if arch not in AMD_ARCHITECTURES:
        return None
    memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    return next(gpu for most, gpu in AMD_ARCHITECTURES[arch] if memory_gib <= most)


def float8_gemm_dtype(device: torch.device) -> torch.dtype | None:
    """The float8 encoding of the tensorwise-scaled GEMM this device runs in hardware; None without one
    (CPU, GPUs without float8 tensor cores, ROCm architectures before MI300)."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return None
    if is_rocm():
        return ROCM_FLOAT8.get(architecture(device) or "")
    return torch.float8_e4m3fn if device_supports(device, "tensorwise") else None
