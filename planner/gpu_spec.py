"""One accelerator type's datasheet figures: what the catalog lists and what a user may supply.

Kept apart from the catalog package so that the input specs (planner/specs.py) can name it without
importing the model catalog, which itself imports the specs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from planner.bounds import (
    MAX_DEVICE_GBPS,
    MAX_DEVICE_MEMORY_GIB,
    MAX_DEVICE_TFLOPS,
    MAX_GPUS_PER_NODE,
    MAX_SCALEUP_DOMAIN_GPUS,
    MIN_DEVICE_MEMORY_GIB,
    MIN_DEVICE_TFLOPS,
    MIN_LINK_GBPS,
    MIN_MEMORY_BANDWIDTH_GBPS,
)

# Bounded away from zero as well as above: the cost model divides by every one of these.
Tflops = Annotated[float, Field(ge=MIN_DEVICE_TFLOPS, le=MAX_DEVICE_TFLOPS, allow_inf_nan=False)]
LinkGbps = Annotated[float, Field(ge=MIN_LINK_GBPS, le=MAX_DEVICE_GBPS, allow_inf_nan=False)]


class GpuSpec(BaseModel):
    """One accelerator type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$")]
    """Canonical name (catalog entries), or the name a user gives a GPU type of their own."""
    aliases: tuple[str, ...] = ()
    """Other names accepted for it (case-insensitive)."""
    memory_gib: Annotated[
        float, Field(ge=MIN_DEVICE_MEMORY_GIB, le=MAX_DEVICE_MEMORY_GIB, allow_inf_nan=False)
    ]
    """Device memory usable by the framework, GiB."""
    peak_bf16_tflops: Tflops
    """Dense bf16 tensor throughput, TFLOP/s (the MFU denominator)."""
    peak_fp32_tflops: Tflops
    """Dense fp32 (non-tensor-core) throughput, TFLOP/s."""
    peak_fp8_tflops: Tflops | None = None
    """Dense float8 tensor-core throughput, TFLOP/s; None: the type has no float8 tensor cores (or
    they are not offered: Float8 plans are refused on it)."""
    mx_formats: bool = False
    """Whether the tensor cores run MX block-scaled formats (MXFP8: Blackwell)."""
    peak_fp4_tflops: Tflops | None = None
    """Dense FP4 (NVFP4 / MXFP4) tensor-core throughput, TFLOP/s, for reference: no FP4 training
    recipe is planned (torchao trains in MXFP8 at the lowest), so nothing is priced from it."""
    memory_bandwidth_gbps: Annotated[
        float, Field(ge=MIN_MEMORY_BANDWIDTH_GBPS, le=MAX_DEVICE_GBPS, allow_inf_nan=False)
    ]
    """HBM (or DRAM) bandwidth, GB/s."""
    intra_node_bandwidth_gbps: LinkGbps
    """Per-GPU unidirectional scale-up link bandwidth (NVLink, Infinity Fabric, PCIe, shared memory)
    among the GPUs of one scale-up domain (`scaleup_domain_gpus`), GB/s."""
    inter_node_bandwidth_gbps: LinkGbps
    """Default per-GPU scale-out network bandwidth (the NIC's) between scale-up domains, GB/s."""
    default_gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] = 8
    """GPUs in a typical host (node) of this type."""
    scaleup_domain_gpus: Annotated[int, Field(ge=1, le=MAX_SCALEUP_DOMAIN_GPUS)] | None = None
    """GPUs in one scale-up domain of the type's usual system where it reaches beyond one host
    (72: a GB200 NVL72 rack of 18 hosts of 4); None: the domain is the host."""
    nominal_memory_gb: (
        Annotated[float, Field(ge=MIN_DEVICE_MEMORY_GIB, le=MAX_DEVICE_MEMORY_GIB, allow_inf_nan=False)]
        | None
    ) = None
    """The memory size the type is sold as (80 for an H100 80GB), so that a card of another size
    (a 94 GB card of a 96 GB type) scales `memory_gib` by the same usable share. None: `memory_gib`."""
    board_power_w: Annotated[float, Field(ge=10, le=1e5, allow_inf_nan=False)] | None = None
    """The board power the peaks are rated at (700 W for an H100 SXM); a cluster's lower power limit
    slows compute-bound kernels (planner/cost/parameters.py `power_limited_clock`). None: unknown,
    no power limit applies."""
    power_limit_w: Annotated[float, Field(ge=10, le=1e5, allow_inf_nan=False)] | None = None
    """The power limit the type ships at where it is below `board_power_w` (the HBM2e H100 SXM of
    Meta's Grand Teton servers: 500 W of the design's 700); a cluster's own
    `gpu_power_limit_w` replaces it. None: the type runs at its board power."""
    chip: Annotated[str, Field(max_length=32)] | None = None
    """The GPU die (`GH100` for H100 and H200): what the corpus fits a training matmul share for."""
    matmul_efficiency: Annotated[float, Field(ge=0.01, le=1, allow_inf_nan=False)] = 0.8
    """The type's maximum achievable matmul throughput (the best large bf16 GEMM a benchmark finds,
    as in the published MAMF tables) as a fraction of the dense peak; 0.8 is typical of NVIDIA
    datacenter GPUs. Training GEMMs reach a share of it (planner/cost/parameters.py `CorpusFit`)."""
    attention_efficiency: Annotated[float, Field(ge=0.01, le=1, allow_inf_nan=False)] = 0.35
    """Fraction of the dense peak that fused (flash) attention forward and backward achieve on this
    type (published kernel benchmarks: FlashAttention-2 reaches ~35% on an H100, 50-73% on an A100),
    at sequence 16384 and head dim 128; shorter sequences reach less (planner/cost/gemm.py)."""
    sm_count: Annotated[int, Field(ge=1, le=10_000)] | None = None
    """Streaming multiprocessors (the datasheet's): what a GEMM's output tiles are spread over, in
    waves (planner/cost/gemm.py). None: GEMMs are priced at the ceiling whatever their shape."""

    @model_serializer(mode="wrap")
    def _omit_unset_figures(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A custom GPU written before these fields existed serialises (and so hashes) as it did.
        data = handler(self)
        for name in ("peak_fp4_tflops", "scaleup_domain_gpus"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @property
    def is_cpu(self) -> bool:
        """The catalog's `cpu` device: its ranks are processes on CPU cores (gloo), not GPUs."""
        return self.name == "cpu"

    @property
    def nominal_memory(self) -> float:
        """The size the type is sold as, GB (`nominal_memory_gb`, else `memory_gib`)."""
        return self.nominal_memory_gb or self.memory_gib
