"""Catalogs of known models and GPUs, and the one entry point that turns any model input into a ModelSpec."""

from planner.catalog.gpus import GPU_CATALOG, GpuSpec, gpu_for_device, resolve_gpu
from planner.catalog.models import MODEL_CATALOG, resolve_model

__all__ = ["GPU_CATALOG", "MODEL_CATALOG", "GpuSpec", "gpu_for_device", "resolve_gpu", "resolve_model"]
