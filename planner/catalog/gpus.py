"""Accelerator catalog: datasheet peaks that the uncalibrated cost model starts from.

Bandwidths are per GPU and per direction in GB/s (1e9 bytes/s); FLOP/s are dense (no sparsity).
Memory is what the runtime can allocate, in GiB.
"""

from __future__ import annotations

import re

from planner.errors import UnknownCatalogEntryError, did_you_mean
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

# Figures below are per GPU, dense (NVIDIA's and AMD's tables state sparse peaks at twice these), from
# the vendors' datasheets named beside each entry. `memory_gib` is the sold size less the share the
# runtime keeps (as for the entries above: about 1%), to be replaced by what a run reports.

# Blackwell in NVIDIA's rack-scale and HGX systems. GB200 NVL72 datasheet (nvidia.com, "GB200 NVL72"):
# per rack of 72 GPUs, FP4 1,440 PF, FP8 720 PF, BF16 360 PF, all with sparsity; FP32 5,760 TF;
# HBM3e 13.4 TB at 576 TB/s; fifth-generation NVLink at 1.8 TB/s per GPU (both directions) over one
# 72-GPU NVLink domain of 18 compute trays, each 2 Grace CPUs and 4 GPUs; one 400 Gb/s ConnectX-7
# per GPU for the scale-out network. The GPU is rated at 1,200 W in it.
# GB300 NVL72 and HGX B300 datasheets (nvidia.com, "GB300 NVL72", "HGX B300"): Blackwell Ultra, BF16
# and FP8 as GB200 in the rack (360 / 720 PF sparse per 72), dense FP4 1,080 PF per rack (15 PF per
# GPU) and 108 PF per HGX B300 board of 8 (13.5 PF); 288 GB HBM3e per GPU (GB300 NVL72: 20 TB, 279
# GB per GPU usable; HGX B300: 2.3 TB per 8, 270 GB per GPU usable); 8 TB/s; one 800 Gb/s
# ConnectX-8 SuperNIC per GPU; GB300 at 1,400 W, B300 at 1,100 W. MX formats (MXFP8) run on every
# Blackwell tensor core.
# Maximum achievable matmul throughput (MAMF: the best bf16 `matmul` of a shape sweep, mean of 100
# iterations) as Stas Bekman's ml-engineering book measured it (compute/accelerator/README.md at
# stas00/ml-engineering@744d01e, "Maximum Achievable Matmul FLOPS comparison table"): GB200 1,822 TF
# (torch 2.10 nightly, CUDA 13.0), B300 1,769 TF (torch 2.9.1, CUDA 13.0), B200 1,745 TF. No GB300 has
# been measured: it takes GB200's share, the same NVL72 system at the same stated peak (B300's die
# measures as B200's, 1,769 against 1,745 TF).
_BLACKWELL_SYSTEMS = (
    GpuSpec(
        name="GB200",
        aliases=("GB200-NVL72", "B200-GB200"),
        memory_gib=184.0,
        peak_bf16_tflops=2500.0,
        peak_fp32_tflops=80.0,
        peak_fp8_tflops=5000.0,
        peak_fp4_tflops=10000.0,
        mx_formats=True,
        memory_bandwidth_gbps=8000,
        intra_node_bandwidth_gbps=900,
        inter_node_bandwidth_gbps=50,
        default_gpus_per_node=4,
        scaleup_domain_gpus=72,
        nominal_memory_gb=186,
        board_power_w=1200,
        matmul_efficiency=0.729,  # MAMF 1,822 of 2,500 TF
        attention_efficiency=0.35,
        chip="GB100",
        sm_count=148,
    ),
    GpuSpec(
        name="GB300",
        aliases=("GB300-NVL72",),
        memory_gib=276.0,
        peak_bf16_tflops=2500.0,
        peak_fp32_tflops=80.0,
        peak_fp8_tflops=5000.0,
        peak_fp4_tflops=15000.0,
        mx_formats=True,
        memory_bandwidth_gbps=8000,
        intra_node_bandwidth_gbps=900,
        inter_node_bandwidth_gbps=100,
        default_gpus_per_node=4,
        scaleup_domain_gpus=72,
        nominal_memory_gb=279,
        board_power_w=1400,
        matmul_efficiency=0.729,  # GB200's MAMF share (no GB300 measured)
        attention_efficiency=0.35,
        sm_count=160,
    ),
    GpuSpec(
        name="B300",
        aliases=("B300-288GB", "HGX-B300"),
        memory_gib=268.0,
        peak_bf16_tflops=2250.0,
        peak_fp32_tflops=75.0,
        peak_fp8_tflops=4500.0,
        peak_fp4_tflops=13500.0,
        mx_formats=True,
        memory_bandwidth_gbps=8000,
        intra_node_bandwidth_gbps=900,
        inter_node_bandwidth_gbps=100,
        nominal_memory_gb=270,
        board_power_w=1100,
        matmul_efficiency=0.786,  # MAMF 1,769 of 2,250 TF
        attention_efficiency=0.35,
        sm_count=160,
    ),
)

# Hopper variants sold where the H100 could not be. H800 SXM (NVIDIA's H800 product brief): the
# H100 SXM's die, memory and peaks with NVLink cut to 400 GB/s per GPU (both directions), 700 W;
# the 400 Gb/s InfiniBand per GPU of the clusters that trained on it (DeepSeek-V3 technical report).
# H20 (NVIDIA's H20 product brief): 96 GB HBM3 at 4.0 TB/s, FP8 296 TF, BF16 148 TF, FP32 44 TF
# dense, NVLink 900 GB/s (both directions), 400 W; 78 SMs (the device's own report).
_HOPPER_VARIANTS = (
    GpuSpec.model_validate({
        **_H100_SXM.model_dump(),
        "name": "H800",
        "aliases": ("H800-SXM", "H800-80GB"),
        "intra_node_bandwidth_gbps": 200,
    }),
    GpuSpec(
        name="H20",
        aliases=("H20-96GB",),
        memory_gib=95.0,
        peak_bf16_tflops=148.0,
        peak_fp32_tflops=44.0,
        peak_fp8_tflops=296.0,
        memory_bandwidth_gbps=4000,
        intra_node_bandwidth_gbps=450,
        inter_node_bandwidth_gbps=50,
        nominal_memory_gb=96,
        board_power_w=400,
        matmul_efficiency=0.801,
        attention_efficiency=0.35,
        chip="GH100",
        sm_count=78,
    ),
)

# L40S datasheet (nvidia.com, "L40S"): Ada Lovelace AD102, 48 GB GDDR6 with ECC at 864 GB/s, BF16
# 362.05 TF and FP8 733 TF dense, FP32 91.6 TF, 350 W, 142 SMs; no NVLink: PCIe Gen4 x16 at 64 GB/s
# (both directions) between GPUs. The network is the server's: 200 Gb/s per GPU is assumed (four
# 400 Gb/s NICs per 8-GPU server), a default to override.
_L40S = GpuSpec(
    name="L40S",
    aliases=("L40S-48GB",),
    memory_gib=44.4,
    peak_bf16_tflops=362.05,
    peak_fp32_tflops=91.6,
    peak_fp8_tflops=733.0,
    memory_bandwidth_gbps=864,
    intra_node_bandwidth_gbps=32,
    inter_node_bandwidth_gbps=25,
    nominal_memory_gb=48,
    board_power_w=350,
    chip="AD102",
    sm_count=142,
)

# AMD Instinct, eight GPUs per platform fully connected by fourth-generation Infinity Fabric (7 links
# per GPU). MI300X and MI325X datasheets (amd.com): 304 CUs, BF16 1,307.4 TF and FP8 2,614.9 TF
# dense, FP32 163.4 TF; 192 GB HBM3 at 5.3 TB/s (MI300X, 750 W) and 256 GB HBM3E at 6 TB/s (MI325X,
# 1,000 W); 7 links of 128 GB/s (both directions): 448 GB/s out of each GPU. MI355X datasheet: 256 CUs
# (CDNA 4), BF16 2.5 PF, FP8 5.0 PF and MXFP4 10 PF dense, FP32 157.3 TF; 288 GB HBM3E at 8 TB/s,
# 1,400 W; 7 links of 153.6 GB/s: 537.6 GB/s out of each GPU. One 400 Gb/s NIC per GPU (AMD's
# Pollara 400 reference platforms). Their best large bf16 GEMM, as the MAMF table named above for the
# Blackwell systems measured it: MI300X 668.4 TF (torch 2.5.1, ROCm 6.3, TunableOp on: the table's
# current row; an older one had 782 TF on ROCm 6.2 at another shape), MI325X 784.9 TF (ROCm 6.2,
# TunableOp on, 1,000 W), MI355X 1,565 TF (torch 2.8, ROCm 7.0.2, TunableOp off), each over its
# datasheet peak. Attention is what torch's own flash-attention op runs on ROCm (its SDPA backend, by
# default AOTriton's Triton kernels: torch.backends.cuda.preferred_rocm_fa_library), the kernel the
# planner's engines call. AMD's "Deep Dive into Primus" (ROCm blogs, 2026-01-15) profiles Llama 3.1 70B
# on Primus's TorchTitan backend without its kernel library on MI300-class GPUs (seq 8192, full
# checkpointing, Tables 1-2): aten::mm 67.43% of the step, aten::_flash_attention_backward 19.47%,
# _forward 7.48%. At that model's FLOPs (causal attention 2 s h per token and layer, recomputed, its
# backward 2.5x; every linear and the output head) attention's FLOPs are 0.0872 of the GEMMs' and its
# time 0.400: it runs at 0.218 of the GEMMs' rate, 0.222 at the 16k sequence the figure is quoted at
# (`sequence_scale`). Those are 70B's large GEMMs, which the catalog's ceiling (a lone large GEMM's
# MAMF) describes; like every attention figure here it is a kernel's, before the training share the
# corpus fits for GEMMs: MI300X 0.222 x 0.511 = 0.113 and MI325X 0.222 x 0.6 = 0.133 of peak. The
# same blog's Figure 1 puts AMD's AITER kernels (the attention Primus-Turbo switches to) at 47% less
# forward and 75% less backward latency: 3.05x the native op (the corpus' `aiter` attention kernel).
# FlashAttention-2's CK port sits between the two: Azure's AI benchmarking guide
# (Azure_Results/ND_MI300X_v5_results.md, as in the fork samuel-bohman/AI-benchmarking-guide) times it
# at 328.6 TF on an ND MI300X v5 (seq 8192, head dim 64), 0.25 of peak, the figure the catalog took
# before, which torch's op does not reach.
# MI355X has no published figure and keeps the H100's. Float8
# runs on all three (torchao picks the e4m3fnuz encoding on MI300X and MI325X); torchao's MX training
# kernels are CUDA's, so no MXFP8 here.
_MI300X = GpuSpec(
    name="MI300X",
    aliases=("MI300X-192GB", "Instinct-MI300X"),
    memory_gib=191.0,
    peak_bf16_tflops=1307.4,
    peak_fp32_tflops=163.4,
    peak_fp8_tflops=2614.9,
    memory_bandwidth_gbps=5300,
    intra_node_bandwidth_gbps=448,
    inter_node_bandwidth_gbps=50,
    nominal_memory_gb=192,
    board_power_w=750,
    matmul_efficiency=0.511,  # MAMF 668.4 of 1,307.4 TF
    attention_efficiency=0.113,  # torch's flash op: 0.222 of the GEMM ceiling (above)
    chip="CDNA3",
    sm_count=304,
)
_AMD_INSTINCT = (
    _MI300X,
    GpuSpec.model_validate({
        **_MI300X.model_dump(),
        "name": "MI325X",
        "aliases": ("MI325X-256GB", "Instinct-MI325X"),
        "memory_gib": 254.5,
        "memory_bandwidth_gbps": 6000,
        "nominal_memory_gb": 256,
        "board_power_w": 1000,
        "matmul_efficiency": 0.6,  # MAMF 784.9 of 1,307.4 TF
        "attention_efficiency": 0.133,  # 0.222 x 0.6
    }),
    GpuSpec(
        name="MI355X",
        aliases=("MI355X-288GB", "Instinct-MI355X"),
        memory_gib=286.5,
        peak_bf16_tflops=2516.6,
        peak_fp32_tflops=157.3,
        peak_fp8_tflops=5033.2,
        peak_fp4_tflops=10066.3,
        memory_bandwidth_gbps=8000,
        intra_node_bandwidth_gbps=537.6,
        inter_node_bandwidth_gbps=50,
        nominal_memory_gb=288,
        board_power_w=1400,
        matmul_efficiency=0.622,  # MAMF 1,565 of 2,516.6 TF
        attention_efficiency=0.35,
        chip="CDNA4",
        sm_count=256,
    ),
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
        *_BLACKWELL_SYSTEMS,
        *_HOPPER_VARIANTS,
        _L40S,
        *_AMD_INSTINCT,
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

MX_GPUS = ", ".join(sorted(gpu.name for gpu in GPU_CATALOG.values() if gpu.mx_formats))
"""The catalog's GPUs with MX (block-scaled) tensor cores, as refusals and bundle headers name them."""
FP8_GPUS = ", ".join(sorted(gpu.name for gpu in GPU_CATALOG.values() if gpu.peak_fp8_tflops))
"""The catalog's GPUs with float8 tensor (matrix) cores, which the tensorwise and rowwise recipes train
on, as bundle headers name them."""


def resolve_gpu(name: str) -> GpuSpec:
    """The catalog entry for a GPU name or alias, case-insensitively."""
    gpu = _BY_LOWER_NAME.get(name.strip().lower())
    if gpu is None:
        known = ", ".join(sorted(GPU_CATALOG))
        names = [key for gpu in GPU_CATALOG.values() for key in (gpu.name, *gpu.aliases)]
        raise UnknownCatalogEntryError(
            f"unknown GPU {name!r}{did_you_mean(name, names)}; known GPUs: {known} (aliases such as H100 "
            "and A100 work too)",
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
