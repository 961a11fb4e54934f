"""The cost model's parameters: catalog defaults, replaced by fitted values from a calibration.

Defaults are datasheet peaks times efficiencies typical of PyTorch training at scale (GEMMs at ~50%
of dense peak, flash attention at ~35%, elementwise kernels at ~60% of memory bandwidth, NCCL at
~80% of link bandwidth). They were set against torchtitan's published Llama 3.1 8B / 8x H100 runs
(bench/RESULTS.md compares them); calibration replaces them with measurements.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from contract.mesh import LinkClass
from contract.training_config import Precision
from planner.catalog.gpus import GpuSpec
from planner.cost.expert_dispatch import ExpertDispatch, ExpertPlacement
from planner.specs import ClusterSpec

GIB = 1024.0**3


QUOTED_GROUP_SIZE = 8
"""The group size at which the CLI and the dashboard quote a link's collective latency: a node's 8
GPUs. The fit's intercept (`latency_s`) is the latency of a group of one, which no collective runs."""


@dataclass(frozen=True, slots=True)
class DimensionMargin:
    """The memory margin of plans that use one parallel dimension (degree > 1), where the corpus runs
    that used it were under-predicted by more than the others."""

    dimension: str
    """A mesh axis: `tp`, `pp` or `cp`."""
    margin: float
    """As `CostParameters.memory_margin`: a fraction of the predicted peak."""
    reason: str
    """Why, in words a plan shows."""


@dataclass(frozen=True, slots=True)
class DimensionThroughput:
    """Where the corpus runs that used one parallel dimension, at `degree` or more, ran slower than
    priced by more than a prediction is held to: plans that use it carry a warning saying so."""

    dimension: str
    """A mesh axis: `tp`, `pp` or `cp`."""
    degree: int
    """The smallest degree of the dimension among the runs over-predicted past the tolerance."""
    worst: float
    """Their largest over-prediction of tokens/s (predicted / measured - 1)."""
    reason: str
    """What the warning says, in words a plan shows."""


@dataclass(frozen=True, slots=True)
class LinkParameters:
    """Collective cost on one link class: time = latency + bytes x (n-1)/n / bandwidth."""

    latency_s: float
    """Fixed cost of one collective (launch, synchronisation)."""
    latency_per_log2_s: float
    """Extra latency per doubling of the group (tree / ring steps)."""
    bandwidth: float
    """Achieved bus bandwidth per GPU, bytes/s."""

    def latency(self, group_size: int) -> float:
        return self.latency_s + self.latency_per_log2_s * math.log2(max(group_size, 1))


FLOAT8_GEMM_EFFICIENCY: dict[str, float] = {"tensorwise": 1.0, "rowwise": 0.65, "mxfp8": 1.0}
"""A float8 GEMM's achievable fraction of the float8 peak, relative to a bf16 GEMM's of the bf16 peak
(1.0: float8 GEMMs run the 2x faster the peaks allow). Fitted (`python bench/float8_fidelity.py
--fit`) to the corpus's Float8 runs with torchao as speed-ups over the same setting in bf16, so the
bf16 model's own error cancels, and bounded by the peaks' 2x: tensorwise and MXFP8 reach it (the fit
would go past it: the rest of the step gains too), rowwise's scaled GEMMs run about 1.3x bf16's."""
FLOAT8_CAST_BYTES_PER_ELEMENT: dict[tuple[str, bool], float] = {
    ("tensorwise", False): 5.0,
    ("tensorwise", True): 3.0,
    ("rowwise", False): 3.0,
    ("rowwise", True): 3.0,
    ("mxfp8", False): 3.0,
    ("mxfp8", True): 3.0,
}
"""Memory traffic of casting one element to float8, by (recipe, compiled): read bf16 and write
float8 (3 bytes), plus, for tensorwise scaling in eager mode, a separate pass that reads the tensor
for its absolute maximum (inductor fuses it into the cast; rowwise and MX scales come from the row
or block the cast kernel holds anyway)."""


EXPERT_LOAD_IMBALANCE = 1.2
"""Default `CostParameters.expert_load_imbalance`: the routed rows of a micro-batch's most-loaded expert
over the mean. Balanced routers (an auxiliary balance loss, or DeepSeek-V3's per-expert bias adjusted
between steps) keep it near 1 over whole runs, not in every micro-batch: the auxiliary-loss-free
balancing paper (Wang et al. 2024, arXiv:2408.15664, the method DeepSeek-V3 trains with) measures it as
MaxVio = max expert load / mean load - 1, per batch and over the run, and torchtitan's and Megatron's
MoE write-ups name the imbalance among the costs of expert parallelism. 1.2 is a round figure for a
micro-batch's, read off neither one table nor fitted to any run: the fidelity step with published MoE
runs (issue 40, item 5) is where it is checked."""

GROUPED_MM_EFFICIENCY = 0.45
"""Default `CostParameters.grouped_gemm_efficiency`: torch's bf16 grouped GEMM (`torch._grouped_mm`, the
CUTLASS kernel torchtitan's and this project's experts run) against the dense GEMM rate the catalog's
`matmul_efficiency` states, forward and backward together (its weight gradient is a K-grouped GEMM,
the slowest of the three). torchao's MoE-training microbenchmark (torchao/prototype/moe_training/README.md
at pytorch/ao@36027d8, "Autograd function", one B200, torch 2.10 nightly, compiled) times a forward and
backward of 128,000 routed rows at 0.41-0.49 of the B200's measured dense GEMM rate (753-862 TFLOP/s
against 1,745): DeepSeek-V3's expert shapes (2048 x 7168) at 1, 2, 4 and 8 experts per GPU, and
Llama 4 Scout's (8192 x 5120). Hopper's grouped kernel is the same CUTLASS design and takes the
B200's share until a calibration times it: a profile of a mixture of experts times the grouped GEMM
beside the dense one at the model's expert shapes (executor/profile/grouped_gemm.py), and the fit
replaces this with their median ratio (planner/calibration.py `grouped_gemm_efficiency`). The vendor
BLAS's GEMMs per expert (Transformer Engine's grouped linear layers in Megatron, the `grouped_gemm`
package in NeMo AutoModel) are not this kernel:
the fidelity corpus states which one a run used."""


@dataclass(frozen=True, slots=True)
class CostParameters:
    """Everything the cost model needs to know about the hardware and software stack."""

    peak_flops: float
    """Dense FLOP/s of the compute dtype (bf16 tensor cores, or fp32)."""
    mfu_peak_flops: float
    """The MFU denominator: the GPU's dense bf16 peak."""
    matmul_efficiency: float
    """Fraction of `peak_flops` that large GEMMs achieve."""
    matmul_overhead_s: float
    """Fixed time per GEMM kernel (launch and tail effects; dominates small shapes)."""
    attention_efficiency: float
    """Fraction of `peak_flops` that (flash) attention achieves."""
    memory_bandwidth: float
    """Achieved memory bandwidth for elementwise kernels, bytes/s."""
    kernel_overhead_s: float
    """Fixed time per non-GEMM kernel launch in eager mode."""
    compile_traffic_fraction: float
    """Elementwise memory traffic left after inductor fusion, as a fraction of eager."""
    compile_kernel_fraction: float
    """Kernel launches left after inductor fusion, as a fraction of eager."""
    optimizer_bytes_per_param: float
    """Memory traffic of one optimizer step (with gradient clipping) per (sharded) parameter."""
    links: dict[LinkClass, LinkParameters]
    """Collective costs inside a node and between nodes."""
    overlap_contention: float
    """Slowdown of compute while a collective runs beside it (shared SMs and memory)."""
    workspace_gib: float
    """Library workspace inside the caching allocator (cuBLAS) per GPU."""
    allocator_reserve: float
    """Memory the caching allocator holds reserved but cannot hand out (fragmentation), as a
    fraction of the step's transient allocations. Launchers set `expandable_segments:True`, which
    keeps it small."""
    memory_capacity_gib: float
    """Memory per GPU."""
    fp8_peak_flops: float = 0.0
    """Dense float8 FLOP/s (at the power limit's clock); 0: no float8 tensor cores."""
    float8_gemm_efficiency: dict[str, float] = field(default_factory=lambda: dict(FLOAT8_GEMM_EFFICIENCY))
    """Per Float8 recipe, its GEMMs' achievable share of the float8 peak relative to bf16's share of its
    own (FLOAT8_GEMM_EFFICIENCY; a calibration that timed float8 GEMMs replaces tensorwise's)."""
    context_gib: float = 0.0
    """Taken outside the allocator before training allocates anything: the CUDA context, NCCL's
    communicators and buffers. Calibration measures it (`torch.cuda.mem_get_info`)."""
    optimizer_temp_bytes_per_param: float = 0.0
    """Temporaries of one optimizer update per (sharded) parameter (foreach AdamW's denominators)."""
    activation_memory_scale: float = 1.0
    """Correction on eager activation memory, fitted from measured step peaks."""
    compiled_activation_memory_scale: float = 1.0
    """Correction on compiled activation memory (inductor's partitioner saves its own choice)."""
    memory_margin: float = 0.12
    """Headroom a plan keeps on top of its predicted peak, as a fraction of it: the memory model's
    largest measured under-prediction (wider uncalibrated; from the fit's residuals when calibrated)."""
    memory_margin_reason: str = "uncalibrated: the memory model's largest measured under-prediction"
    """Why `memory_margin` is what it is (shown with every plan)."""
    dimension_margins: tuple[DimensionMargin, ...] = ()
    """Wider margins for plans that use a parallel dimension the memory model has under-predicted
    more (planner/cost/memory.py `memory_margin_for`)."""
    dimension_throughput: tuple[DimensionThroughput, ...] = ()
    """Parallel dimensions whose published runs ran slower than priced (planner/plan_warnings.py
    warns the plans that use them)."""
    compute_scale: float = 1.0
    """Correction factor on predicted compute time (fitted from whole-block measurements)."""
    compiled_compute_scale: float = 1.0
    """Further correction on compute time of compiled (SimpleFSDP + torch.compile) configurations
    only, on top of `compute_scale`: what inductor's fusion and scheduling gain or lose beyond the
    fused-traffic and kernel-count fractions. Fitted from timed compiled steps after the eager fit."""
    optimizer_overhead_s: float = 0.0
    """Fixed time of one optimizer step and gradient clip (launches, per-tensor dispatch)."""
    micro_batch_overhead_s: float = 0.0
    """Eager framework time per micro-batch outside the priced work: FSDP2 hooks, loss, Python."""
    compiled_overhead_s: float = 0.0
    """The same for compiled configurations: one graph per micro-batch, no FSDP2 hooks (fitted
    beside `compiled_compute_scale` from the compiled steps)."""
    sharding_overhead_s: float = 0.0
    """Extra framework time per micro-batch when parameters are sharded rather than replicated
    (gather and reduce hooks, buffer copies, collectives competing with compute)."""
    calibration_id: str | None = None
    """The calibration profile these parameters were fitted from, if any."""
    sm_count: int = 0
    """Streaming multiprocessors: what a GEMM's tiles are spread over (planner/cost/gemm.py). 0: the
    shape is not modelled (the CPU device, a GPU type without one): every GEMM runs at the ceiling."""
    gemm_bandwidth: float = 0.0
    """Memory bandwidth a GEMM streams its operands at, bytes/s (the datasheet's, or the best a
    calibration measured): the memory-bound side of the GEMM roofline. 0: no memory-bound regime."""
    gemm_points: tuple[tuple[int, int, int, float], ...] = ()
    """GEMMs a calibration timed, as (m, n, k, seconds): at these shapes the measured time replaces
    the curve (planner/cost/gemm.py `gemm_seconds`)."""
    expert_load_imbalance: float = EXPERT_LOAD_IMBALANCE
    """A mixture of experts' router: the most-loaded routed expert's tokens over the mean, in a
    micro-batch (planner/cost/gemm.py prices the grouped expert GEMMs at it; `EXPERT_LOAD_IMBALANCE`
    says where the default comes from)."""
    grouped_gemm_efficiency: float = GROUPED_MM_EFFICIENCY
    """The routed experts' grouped GEMMs' rate over the dense GEMM rate at the same shapes (planner/cost/
    gemm.py; `GROUPED_MM_EFFICIENCY` says where the default comes from; 1.0: priced as dense GEMMs)."""
    expert_dispatch: ExpertDispatch = "copies"
    """How the expert-parallel all-to-alls move a token (planner/cost/expert_dispatch.py): `copies`, one
    per routed expert (`all_to_all_single`, torchtitan's and this project's runtime); `deduplicated`,
    once per destination rank and node (DeepEP-class kernels, which published runs name)."""
    expert_placement: ExpertPlacement = "random"
    """Where a token's top-k experts sit (planner/cost/expert_dispatch.py): `random` for a router's
    choice; `contiguous` for benchmark gates that give each token consecutive experts."""

    @property
    def usable_memory_gib(self) -> float:
        """What the caching allocator can obtain: capacity less the context outside it."""
        return self.memory_capacity_gib - self.context_gib

    def with_changes(self, **changes: object) -> CostParameters:
        return replace(self, **changes)

    def as_document(self) -> dict:
        """JSON-ready values (what a stored calibration shows as its fitted parameters)."""
        return asdict(self)


@dataclass(frozen=True)
class CorpusFit:
    """The few shares of the GPU datasheets that no datasheet states, fitted to the corpus of
    measured training runs (planner/fidelity: `fsdp-planner fidelity` refits them, with each source
    left out in turn). Everything else the uncalibrated model uses is a datasheet figure or a
    published measurement of the GPU type (planner/catalog/gpus.py)."""

    matmul_share: float
    """For chips the corpus has too few runs of: the share of the maximum achievable matmul
    throughput (see `matmul_share_by_chip`) that a chip drawing one dense bf16 TFLOP/s per board
    watt reaches. A chip's own share is this over the cube root of its power density
    (`matmul_share_for`), the fitted chips' shares times the cube roots of theirs averaged
    (planner/fidelity/fit.py): a training step holds the GPU at its board power, and the clock that
    power sustains falls as the cube root of the work each watt must carry (`power_limited_clock`'s
    law)."""
    matmul_share_by_chip: dict[str, float]
    """The same, fitted per chip where the corpus has enough runs of it (`GpuSpec.chip`): how far a
    chip's GEMMs fall below its best one depends on its tile sizes, SM count and power headroom
    (an H100 draws its whole 700 W in a training step, an A100 rarely its 400 W)."""
    elementwise_bandwidth_share: float
    """Of HBM bandwidth, the share eager elementwise kernels (norms, RoPE, activations, the loss,
    the optimizer) reach, counting their fp32 intermediates as the bf16 bytes priced."""
    overlap_contention: float
    """How much slower compute runs while a collective runs beside it (NCCL's kernels take SMs
    and memory bandwidth from the compute stream)."""
    memory_margin: float
    """The margin an uncalibrated plan keeps on its predicted peak: the corpus' largest memory
    under-prediction, plus a step."""
    memory_margin_reason: str
    """Why, in words a plan shows."""
    dimension_margins: tuple[DimensionMargin, ...] = ()
    """Per parallel dimension whose corpus runs were under-predicted by more, their margin."""
    dimension_throughput: tuple[DimensionThroughput, ...] = ()
    """Per parallel dimension whose corpus runs were over-predicted past the tolerance, the evidence."""

    def matmul_share_for(self, gpu: GpuSpec) -> float:
        """The share `gpu`'s GEMMs reach in a training step: its chip's fitted one, else the power
        density law's."""
        fitted = self.matmul_share_by_chip.get(gpu.chip or "")
        if fitted is not None:
            return fitted
        return self.matmul_share / power_density(gpu) ** (1.0 / 3.0)


CORPUS_FIT = CorpusFit(
    matmul_share=0.835,
    matmul_share_by_chip={"GA100": 0.9, "GH100": 0.75},
    elementwise_bandwidth_share=0.55,
    overlap_contention=0.5,
    memory_margin=0.16,
    memory_margin_reason=(
        "uncalibrated: against 24 measured peaks of published and own GPU runs (7 sources; `fsdp-planner "
        "fidelity`), the memory model has under-predicted by at most 12.2%; 16% covers that with 2% to spare"
    ),
    dimension_margins=(
        DimensionMargin(
            "pp",
            0.34,
            "uncalibrated, with pipeline parallelism: against 6 measured peaks of published runs that used "
            "it (1 source; `fsdp-planner fidelity` lists the corpus), the memory model has under-predicted "
            "by at most 24.1%; 34% covers that with 2% to spare",
        ),
        DimensionMargin(
            "tp",
            0.24,
            "uncalibrated, with tensor parallelism: against 2 measured peaks of published runs that used it "
            "(1 source; `fsdp-planner fidelity` lists the corpus), the memory model has under-predicted by "
            "at most 17.8%; 24% covers that with 2% to spare",
        ),
    ),
    dimension_throughput=(
        DimensionThroughput(
            "cp",
            2,
            0.619,
            "optimistic throughput: of 6 published runs with context parallelism at cp=2 or more (1 source; "
            "`fsdp-planner fidelity` lists the corpus, bench/RESULTS.md prices them), 5 ran more than 15% "
            "slower than the model prices them, up to 1.62x: take this plan's tokens/s as an upper bound "
            "until a run on the target GPUs measures it",
        ),
        DimensionThroughput(
            "tp",
            8,
            0.26,
            "optimistic throughput: of 17 published runs with tensor parallelism at tp=8 or more (3 "
            "sources; `fsdp-planner fidelity` lists the corpus, bench/RESULTS.md prices them), 2 ran more "
            "than 15% slower than the model prices them, up to 1.26x: take this plan's tokens/s as an upper "
            "bound until a run on the target GPUs measures it",
        ),
    ),
)
"""The committed fit (`fsdp-planner fidelity --write` refits it; tests/planner/test_fidelity.py checks
that it is what the fit gives)."""

UNSTATED_POWER_DENSITY = 1.0
"""Dense bf16 TFLOP/s per board watt assumed for a GPU whose board power is not stated (a custom
GPU): between the fitted chips' (A100 0.78, H100 1.41), so its share is `CorpusFit.matmul_share`."""


def power_density(gpu: GpuSpec) -> float:
    """Dense bf16 TFLOP/s per watt of board power: how much tensor-core work each watt a training
    step draws must carry (A100 0.78, H100 1.41, B200 2.25, GB300 1.79, MI325X 1.31)."""
    if not gpu.board_power_w:
        return UNSTATED_POWER_DENSITY
    return gpu.peak_bf16_tflops / gpu.board_power_w


STATIC_POWER_FRACTION = 0.2
"""Share of a GPU's board power drawn whatever the clock (leakage, HBM, fans and board), so not
freed by clocking down: a power cap takes its watts from the rest."""


def power_limited_clock(board_power_w: float | None, power_limit_w: float | None) -> float:
    """The compute clock a power cap leaves, as a fraction of the rated one (1 without a cap).

    Dynamic power grows as frequency x voltage squared, and voltage scales with frequency over the
    range a GPU's clock manager uses, so it grows as the cube of the clock: the clock a cap allows is
    the cube root of the dynamic power it leaves (500 W of 700 on an H100: 0.86). Memory bandwidth
    and links keep their own clocks.
    """
    if board_power_w is None or power_limit_w is None or power_limit_w >= board_power_w:
        return 1.0
    dynamic = (power_limit_w / board_power_w - STATIC_POWER_FRACTION) / (1.0 - STATIC_POWER_FRACTION)
    return max(dynamic, 0.05) ** (1.0 / 3.0)


def default_parameters(
    gpu: GpuSpec, cluster: ClusterSpec, precision: Precision, fit: CorpusFit = CORPUS_FIT
) -> CostParameters:
    """Uncalibrated parameters from the GPU catalog (and the cluster's bandwidth overrides, memory
    size and power limit), with the shares `fit` to the corpus of measured runs (the CPU entry keeps
    its own: nothing in the corpus ran on a CPU)."""
    is_cpu = gpu.is_cpu
    intra_bw = (cluster.intra_node_bandwidth_gbps or gpu.intra_node_bandwidth_gbps) * 1e9
    inter_bw = (cluster.inter_node_bandwidth_gbps or gpu.inter_node_bandwidth_gbps) * 1e9
    power_limit = cluster.gpu_power_limit_w if cluster.gpu_power_limit_w is not None else gpu.power_limit_w
    clock = power_limited_clock(gpu.board_power_w, power_limit)
    peak = (gpu.peak_bf16_tflops if precision == "bf16" else gpu.peak_fp32_tflops) * 1e12 * clock
    return CostParameters(
        peak_flops=peak,
        mfu_peak_flops=gpu.peak_bf16_tflops * 1e12,
        matmul_efficiency=gpu.matmul_efficiency * (1.0 if is_cpu else fit.matmul_share_for(gpu)),
        sm_count=gpu.sm_count or 0,
        gemm_bandwidth=0.0 if is_cpu else gpu.memory_bandwidth_gbps * 1e9,
        fp8_peak_flops=(gpu.peak_fp8_tflops or 0.0) * 1e12 * clock,
        matmul_overhead_s=20e-6 if is_cpu else 8e-6,
        attention_efficiency=gpu.attention_efficiency,
        memory_bandwidth=gpu.memory_bandwidth_gbps * 1e9
        * (0.6 if is_cpu else fit.elementwise_bandwidth_share),
        kernel_overhead_s=15e-6 if is_cpu else 5e-6,
        compile_traffic_fraction=0.45,
        compile_kernel_fraction=0.35,
        # AdamW reads param, grad, m, v and writes param, m, v, all fp32.
        optimizer_bytes_per_param=28.0,
        links={
            "intra": LinkParameters(
                latency_s=50e-6 if is_cpu else 12e-6,
                latency_per_log2_s=20e-6 if is_cpu else 2e-6,
                bandwidth=intra_bw * 0.8,
            ),
            "inter": LinkParameters(
                latency_s=100e-6 if is_cpu else 25e-6,
                latency_per_log2_s=40e-6 if is_cpu else 6e-6,
                bandwidth=min(inter_bw, intra_bw) * 0.85,
            ),
        },
        overlap_contention=0.3 if is_cpu else fit.overlap_contention,
        # CPU tensors live in the process heap: no CUDA context or workspace, no caching allocator;
        # on CPU the runtime's optimizer loops over parameters, without foreach temporaries.
        workspace_gib=0.0 if is_cpu else 0.25,
        allocator_reserve=0.0 if is_cpu else 0.05,
        memory_capacity_gib=gpu.memory_gib,
        context_gib=0.0 if is_cpu else 1.0,
        optimizer_temp_bytes_per_param=0.0 if is_cpu else 4.0,
        memory_margin=fit.memory_margin,
        memory_margin_reason=fit.memory_margin_reason,
        dimension_margins=fit.dimension_margins,
        dimension_throughput=fit.dimension_throughput,
    )
