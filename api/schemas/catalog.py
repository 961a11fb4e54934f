"""Bodies of the catalog endpoints (/models, /gpus)."""

from __future__ import annotations

from pydantic import BaseModel

from planner.catalog.gpus import GpuSpec


class ModelInfo(BaseModel):
    name: str
    architecture: str
    num_params: int
    active_params: int | None = None
    """Parameters a token runs: a mixture of experts' top-k routed experts, not all of them (its
    FLOPs and MFU count these); None: every parameter (a dense model)."""
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_seq_len: int


class GpuInfo(GpuSpec):
    """A GPU catalog entry, as the cost model starts from it before calibration."""
