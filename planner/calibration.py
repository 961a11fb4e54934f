"""CalibrationProfile: measurements from short profiling runs, and fitting cost parameters from them.

The profiler (`executor/profile`, torch) writes this JSON on the target machines; the service
stores it; the planner fits its cost model parameters to it. Every section is optional: what was
not measured keeps its catalog default.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.calibration_profile import PROFILE_SCHEMA_VERSION, ProfileSchemaVersion
from contract.mesh import LinkClass, Mesh
from contract.training_config import Optimizer, Precision
from planner.bounds import (
    MAX_BYTES_PER_S,
    MAX_FLOPS_PER_S,
    KernelSeconds,
    StepSeconds,
    rate_problem,
)
from planner.catalog.gpus import GpuSpec, gpu_for_device, resolve_gpu
from planner.cost.estimate import Estimator, block_step_time
from planner.cost.gemm import fit_gemm_ceiling
from planner.cost.model_costs import ModelCosts, model_costs
from planner.cost.parameters import CostParameters, LinkParameters
from planner.cost.setting import Choice, Setting
from planner.errors import PlanningError
from planner.memory_calibration import fit_memory
from planner.specs import GpusPerNode, ModelSpec, NodeCount

MAX_SAMPLES = 10_000

Count = Annotated[int, Field(ge=1, le=1_000_000_000_000)]
MAX_DEVICE_BYTES = 1 << 50
"""1 PiB: far beyond any accelerator's memory, low enough to refuse nonsense."""
DeviceBytes = Annotated[int, Field(ge=0, le=MAX_DEVICE_BYTES)]
Checkpointing = Literal["none", "selective", "op_selective", "full"]
MAX_STEP_LAYERS = 64
MAX_STEP_SAMPLES = 64
"""Timed steps accepted, and their deepest cut of the model: the profiler times about ten steps of 1
to 4 blocks, and the fit prices every step some hundred times at a cost that grows with its depth, so
these bound one upload's fitting to seconds."""
FLOAT8_GEMM_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz")
"""The encodings of the tensorwise float8 GEMM a profile times (OCP e4m3, and AMD MI300's fnuz)."""
MAX_PROFILE_MODEL_LAYERS = 1_000_000
"""The profile's model is only read for one block's costs, but building it is linear in its depth."""


class ProfileModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareFingerprint(ProfileModel):
    """What was measured, so that a profile is used only for matching hardware."""

    device_name: Annotated[str, Field(max_length=200)]
    """e.g. `NVIDIA H100 80GB HBM3` or `cpu`."""
    device_count: Count
    """Ranks that took part."""
    # The cluster's own bounds (planner/specs.py): the fit builds a ClusterSpec from these two, so a
    # fingerprint the planner could not plan is refused here, naming the field, not by the fit.
    num_nodes: NodeCount = 1
    gpus_per_node: GpusPerNode = 1
    backend: Literal["nccl", "gloo"]
    link_class: Annotated[str, Field(max_length=100)] = "unknown"
    """How devices in a node connect (e.g. `NV18`, `PCIe`, `shm`)."""
    torch_version: Annotated[str, Field(max_length=100)]
    cuda_version: Annotated[str, Field(max_length=100)] | None = None
    """The CUDA torch was built for (None on a ROCm build)."""
    hip_version: Annotated[str, Field(max_length=100)] | None = None
    """The HIP (ROCm) torch was built for (None on a CUDA build, and in profiles before 2026-11-28)."""
    nccl_version: Annotated[str, Field(max_length=100)] | None = None
    """NCCL's version, or on ROCm the NCCL version RCCL implements."""


class MatmulSample(ProfileModel):
    """One timed GEMM (m x k) @ (k x n)."""

    m: Count
    n: Count
    k: Count
    dtype: Literal["bfloat16", "float32", "float16", "float8_e4m3fn", "float8_e4m3fnuz"]
    """`float8_e4m3fn`: the tensorwise-scaled float8 GEMM (`torch._scaled_mm`, bf16 out), timed on GPUs
    with float8 tensor cores; `float8_e4m3fnuz` the same GEMM in the encoding MI300-series GPUs take."""
    seconds: KernelSeconds
    """At most 100 PFLOP/s (2·m·n·k / seconds)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @model_validator(mode="after")
    def _possible(self) -> MatmulSample:
        problem = rate_problem(
            amount=self.flops, unit="FLOP", seconds=self.seconds, limit=MAX_FLOPS_PER_S, what="accelerator"
        )
        if problem:
            raise ValueError(problem)
        return self


class BandwidthSample(ProfileModel):
    """One timed memory-bound copy: bytes read + written."""

    bytes: Count
    seconds: KernelSeconds
    """At most 100 TB/s (bytes / seconds)."""

    @model_validator(mode="after")
    def _possible(self) -> BandwidthSample:
        problem = rate_problem(
            amount=self.bytes, unit="B", seconds=self.seconds, limit=MAX_BYTES_PER_S, what="memory"
        )
        if problem:
            raise ValueError(problem)
        return self


class CollectiveSample(ProfileModel):
    """One timed collective; `bytes` is the full (unsharded) tensor size."""

    op: Literal["all_gather", "reduce_scatter", "all_reduce"]
    group_size: Annotated[int, Field(ge=2, le=1_000_000)]
    link: LinkClass
    bytes: Count
    seconds: KernelSeconds
    """At most 100 TB/s of bus bandwidth (bytes x (n-1)/n per pass / seconds)."""

    @property
    def bus_bytes(self) -> float:
        """Bytes each rank moves over its link: (n-1)/n of the tensor per pass, two passes for an
        all-reduce (reduce-scatter, then all-gather)."""
        passes = 2.0 if self.op == "all_reduce" else 1.0
        return passes * self.bytes * (self.group_size - 1) / self.group_size

    @model_validator(mode="after")
    def _possible(self) -> CollectiveSample:
        problem = rate_problem(
            amount=self.bus_bytes, unit="B", seconds=self.seconds, limit=MAX_BYTES_PER_S, what="link"
        )
        if problem:
            raise ValueError(problem)
        return self


class BlockSample(ProfileModel):
    """Forward + backward of the model's own block at one micro-batch."""

    model: Annotated[str, Field(max_length=200)]
    micro_batch_size: Count
    seq_len: Count
    checkpointing: Checkpointing = "none"
    compile: bool = False
    dtype: Literal["bfloat16", "float32"] = "float32"
    seconds: KernelSeconds
    peak_memory_bytes: DeviceBytes | None = None


class StepSample(ProfileModel):
    """A whole training step (the runtime's own step) of the model cut to `num_layers` blocks, on
    `ranks` ranks: sharded over all of them, or replicated; eager FSDP2 or compiled SimpleFSDP.

    Memory fields are per rank, the largest over ranks, over the timed steps (all after the first
    optimizer update, so optimizer state exists). Profiles written before they existed parse with
    the defaults: an eager step without checkpointing whose memory was not measured.
    """

    num_layers: Annotated[int, Field(ge=1, le=MAX_STEP_LAYERS)]
    """Blocks of the profile's model kept (at most the model's own, and at most 64)."""
    micro_batch_size: Count
    grad_accum_steps: Count = 1
    seq_len: Count
    ranks: Count
    sharding: Literal["full_shard", "no_shard"] = "full_shard"
    optimizer: Literal["adamw", "sgd"] = "adamw"
    dtype: Literal["bfloat16", "float32"] = "float32"
    seconds: StepSeconds
    """The whole step (forward, backward, clipping, update)."""
    update_seconds: KernelSeconds
    """Its gradient clipping and optimizer update alone."""
    compile: bool = False
    """Compiled SimpleFSDP (torch.compile over the whole model) rather than eager FSDP2."""
    checkpointing: Checkpointing = "none"
    """Activation checkpointing of every block (the plan's mode, every_k 1)."""
    loss_chunks: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    """Token slices of the output projection and loss (the plan's `config.loss_chunks`)."""
    peak_allocated_bytes: DeviceBytes | None = None
    """Peak bytes held by tensors during a step (CUDA: `max_memory_allocated`)."""
    peak_reserved_bytes: DeviceBytes | None = None
    """Peak bytes the allocator held from the device (CUDA: `max_memory_reserved`; on CPU, where
    no caching allocator holds memory back, equal to allocated)."""
    state_bytes: DeviceBytes | None = None
    """Bytes of parameters, buffers and optimizer state on the rank between steps (the part of
    the peak that does not depend on activations)."""
    memory_source: Literal["cuda", "cpu_tensor_profile", "cpu_rss"] | None = None
    """How memory was measured: the CUDA caching allocator's peaks; on CPU, persistent tensors plus
    the torch profiler's peak net allocation over one step, or (no profiler) the process's peak
    resident set size, an upper bound."""

    @model_validator(mode="after")
    def _reserved_holds_allocated(self) -> StepSample:
        allocated, reserved = self.peak_allocated_bytes, self.peak_reserved_bytes
        if allocated is not None and reserved is not None and reserved < allocated:
            raise ValueError(
                "peak_reserved_bytes is below peak_allocated_bytes: the allocator holds what tensors use"
            )
        return self


class GroupedGemmSample(ProfileModel):
    """One routed expert projection timed as the grouped GEMM (`torch._grouped_mm`) and as the dense
    GEMM of the same work: forward x [experts x rows, k] @ w [experts, k, n], and its backward (the
    input gradient, and the weight gradient: a K-grouped GEMM); the dense one is `torch.mm` of all the
    rows at the same widths, the same FLOPs in one GEMM."""

    experts: Annotated[int, Field(ge=1, le=1_000_000)]
    """Experts (groups) in the kernel: the experts one GPU holds."""
    rows: Count
    """Rows (routed tokens) per expert."""
    n: Count
    k: Count
    dtype: Literal["bfloat16", "float32", "float16"]
    forward_seconds: KernelSeconds
    backward_seconds: KernelSeconds
    dense_forward_seconds: KernelSeconds
    dense_backward_seconds: KernelSeconds
    """Each at most 100 PFLOP/s (the forward 2 x experts x rows x n x k FLOPs, the backward twice that)."""

    @property
    def flops(self) -> float:
        """One forward's FLOPs (of either GEMM)."""
        return 2.0 * self.experts * self.rows * self.n * self.k

    @property
    def efficiency(self) -> float:
        """The grouped GEMM's rate over the dense one's, forward and backward together (the same FLOPs)."""
        dense = self.dense_forward_seconds + self.dense_backward_seconds
        return dense / (self.forward_seconds + self.backward_seconds)

    @model_validator(mode="after")
    def _possible(self) -> GroupedGemmSample:
        for name, passes in (("forward_seconds", 1), ("backward_seconds", 2), ("dense_forward_seconds", 1),
                             ("dense_backward_seconds", 2)):
            problem = rate_problem(amount=passes * self.flops, unit="FLOP", seconds=getattr(self, name),
                                   limit=MAX_FLOPS_PER_S, what="accelerator")
            if problem:
                raise ValueError(f"{name}: {problem}")
        return self


class GroupedGemmProfile(ProfileModel):
    """A mixture of experts' routed expert GEMMs, timed by the profiler at the model's expert shapes
    (executor/profile/grouped_gemm.py): they set `CostParameters.grouped_gemm_efficiency`."""

    samples: Annotated[list[GroupedGemmSample], Field(max_length=MAX_SAMPLES)] = []
    not_measured: Annotated[str, Field(max_length=500)] | None = None
    """Why no sample was timed (torch without `torch._grouped_mm`, a device that refuses it, the budget
    spent): the catalog's efficiency stays."""


class CalibrationProfile(ProfileModel):
    """Measurements of one hardware + software stack."""

    schema_version: ProfileSchemaVersion = PROFILE_SCHEMA_VERSION
    name: Annotated[str, Field(max_length=200)] | None = None
    gpu: Annotated[str, Field(max_length=64)] | None = Field(
        None,
        description="Catalog GPU the measurements refer to (GET /api/v1/gpus). Left out, the service derives "
        "it from `fingerprint.device_name` (`NVIDIA H100 80GB HBM3` is H100-SXM-80GB) and refuses a device "
        "the catalog does not know.",
    )
    fingerprint: HardwareFingerprint
    model: ModelSpec | None = None
    """The model whose blocks were timed (`blocks`)."""
    matmul: Annotated[list[MatmulSample], Field(max_length=MAX_SAMPLES)] = []
    grouped_gemm: GroupedGemmProfile | None = None
    """The routed experts' grouped GEMMs beside dense ones, when `model` is a mixture of experts. None:
    not measured (a dense model, or a profile written before 2026-11-29); the catalog's
    `grouped_gemm_efficiency` stays."""
    memory_bandwidth: Annotated[list[BandwidthSample], Field(max_length=MAX_SAMPLES)] = []
    collectives: Annotated[list[CollectiveSample], Field(max_length=MAX_SAMPLES)] = []
    blocks: Annotated[list[BlockSample], Field(max_length=MAX_SAMPLES)] = []
    steps: Annotated[list[StepSample], Field(max_length=MAX_STEP_SAMPLES)] = []
    overlap_contention: Annotated[float, Field(ge=0, le=2)] | None = None
    """Measured compute slowdown while a collective runs beside it."""
    usable_memory_bytes: DeviceBytes | None = None
    """Free device memory per GPU once CUDA and the process group (NCCL) are initialised, before
    any model (`torch.cuda.mem_get_info`), the smallest over ranks. None on CPU."""

    def catalog_gpu(self) -> GpuSpec | None:
        """The catalog GPU the measurements refer to: `gpu` as named, else the one the device reports
        itself as (`fingerprint.device_name`); None when the catalog knows neither."""
        if self.gpu is None:
            return gpu_for_device(self.fingerprint.device_name)
        try:
            return resolve_gpu(self.gpu)
        except PlanningError:
            return None
    device_memory_bytes: DeviceBytes | None = None
    """Total device memory per GPU (the smallest over ranks). None on CPU."""
    allocator_config: Annotated[str, Field(max_length=500)] | None = None
    """`PYTORCH_CUDA_ALLOC_CONF` the steps ran under ('': torch's default allocator; None: not
    recorded, as in profiles written before 2026-11-28). Only under the launchers' allocator
    (`planner.cost.memory.PRICED_ALLOCATOR_CONFIG`) do reserved peaks fit the allocator's reserve."""

    @model_validator(mode="after")
    def _usable_within_device(self) -> CalibrationProfile:
        usable, total = self.usable_memory_bytes, self.device_memory_bytes
        if usable is not None and total is not None and usable > total:
            raise ValueError("usable_memory_bytes exceeds device_memory_bytes")
        return self

    @model_validator(mode="after")
    def _steps_cut_the_model(self) -> CalibrationProfile:
        if self.model is None:
            return self
        if self.model.num_layers > MAX_PROFILE_MODEL_LAYERS:
            raise ValueError(
                f"model.num_layers: {self.model.num_layers} blocks is more than a profile's model can have "
                f"(at most {MAX_PROFILE_MODEL_LAYERS:,})"
            )
        for index, step in enumerate(self.steps):
            if step.num_layers > self.model.num_layers:
                raise ValueError(
                    f"steps.{index}.num_layers: a timed step keeps at most the model's own "
                    f"{self.model.num_layers} blocks, not {step.num_layers}"
                )
        return self

    def content_id(self) -> str:
        """A stable id from the measurements themselves (`profile-<12 hex>`)."""
        # A field added later is left out while unset, so an older profile keeps its id.
        unset: dict[str, Any] = {}
        if self.allocator_config is None:
            unset["allocator_config"] = True
        if self.grouped_gemm is None:
            unset["grouped_gemm"] = True
        if self.fingerprint.hip_version is None:
            unset["fingerprint"] = {"hip_version"}
        digest = hashlib.sha256(self.model_dump_json(exclude=unset).encode()).hexdigest()
        return f"profile-{digest[:12]}"


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """y = a + b x with a >= 0, b > 0, minimising relative error (weights 1/y^2).

    Relative error lets small samples (which pin the latency / launch overhead) count as much as
    large ones (which pin the throughput); plain least squares would fit the largest only.
    None when there is too little spread to fit a line (one point, all sizes equal) or the fit is
    not a line with positive slope.

    Sizes and times are scaled to at most 1 first and the weights to (0, 1], so that no product
    under- or overflows whatever their magnitude (1/y^2 of a time of 1e200 s is 0.0 in floats).
    """
    points = [(x, y) for x, y in points if 0 <= x < math.inf and 0 < y < math.inf]
    if len(points) < 2:
        return None
    x_scale = max(x for x, _ in points) or 1.0
    y_scale = max(y for _, y in points)
    xs = [x / x_scale for x, _ in points]
    ys = [y / y_scale for _, y in points]
    y_min = min(ys)
    weights = [(y_min / y) ** 2 for y in ys]
    total = sum(weights)
    mx = sum(w * x for w, x in zip(weights, xs, strict=True)) / total
    my = sum(w * y for w, y in zip(weights, ys, strict=True)) / total
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(weights, xs, strict=True))
    if sxx <= 0:
        return None
    b = sum(w * (x - mx) * (y - my) for w, x, y in zip(weights, xs, ys, strict=True)) / sxx
    a = my - b * mx
    if not b > 0:
        return None
    if a < 0:  # no negative latency: refit through the origin
        a = 0.0
        b = sum(w * x * y for w, x, y in zip(weights, xs, ys, strict=True)) / sum(
            w * x * x for w, x in zip(weights, xs, strict=True)
        )
    a, b = a * y_scale, b * y_scale / x_scale
    if not (math.isfinite(a) and math.isfinite(b) and b > 0):
        return None
    return a, b


def _fit_link(points: list[tuple[float, float, int]], default: LinkParameters) -> LinkParameters | None:
    """One link's collective cost from (volume per rank, seconds per pass, group size) samples.

    Samples at two or more group sizes (the profiler measures every power-of-two node-local group,
    the tensor-parallel sizes) fit time = latency + per_log2 x log2(n) + volume / bandwidth, so the
    data say how latency grows with the group. With one group size (or sizes whose samples cannot
    tell the two latency terms apart) the latency is one number, split between its fixed and
    per-doubling parts in the catalog's proportion, anchored at the sizes that were measured.
    None when the samples fit no line with a positive slope.
    """
    plane = _fit_latency_plane(points) if len({g for _, _, g in points}) >= 2 else None
    if plane is not None:
        latency, per_log2, seconds_per_byte = plane
    else:
        line = _fit_line([(v, t) for v, t, _ in points])
        if line is None:
            return None
        latency, seconds_per_byte = line
        mean_log2 = sum(math.log2(g) for _, _, g in points) / len(points)
        d_total = default.latency_s + default.latency_per_log2_s * mean_log2
        share = default.latency_s / d_total if d_total > 0 else 1.0
        latency, per_log2 = latency * share, (latency * (1 - share) / mean_log2) if mean_log2 > 0 else 0.0
    return LinkParameters(
        latency_s=latency,
        latency_per_log2_s=per_log2,
        # A slope of almost nothing (times that barely grow with size) is noise, not a link
        # faster than any hardware: the bandwidth stays within the physical bound.
        bandwidth=1.0 / max(seconds_per_byte, 1.0 / MAX_BYTES_PER_S),
    )


def _fit_latency_plane(points: list[tuple[float, float, int]]) -> tuple[float, float, float] | None:
    """t = a + c log2(n) + b v with a >= 0, c >= 0, b > 0, minimising relative error (weights
    1/t^2, as `_fit_line`): (a, c, b), or None when the samples cannot tell the three apart.

    That takes two group sizes, and two volumes at one of them: the slope must come from messages
    of one group, or a group's extra latency would pass for bandwidth (a profile whose budget ran
    out after each group's first message has three group sizes at one volume each, and a plane
    through them would be exact and meaningless).

    The bounds make it a small convex problem whose optimum is the unconstrained optimum on one
    face (some of a, c held at zero): every face is solved and the best one within the bounds wins.
    Inputs are scaled to at most 1 first, as in `_fit_line`.
    """
    rows = [(v, t, math.log2(g)) for v, t, g in points if 0 <= v < math.inf and 0 < t < math.inf and g >= 2]
    volumes: dict[float, set[float]] = defaultdict(set)
    for v, _, lg in rows:
        volumes[lg].add(v)
    if len(volumes) < 2 or max(len(vs) for vs in volumes.values()) < 2:
        return None
    v_scale = max(v for v, _, _ in rows) or 1.0
    t_scale = max(t for _, t, _ in rows)
    l_scale = max(lg for _, _, lg in rows)
    ts = [t / t_scale for _, t, _ in rows]
    t_min = min(ts)
    weights = [(t_min / t) ** 2 for t in ts]
    columns = {
        "a": [1.0] * len(rows),
        "c": [lg / l_scale for _, _, lg in rows],
        "b": [v / v_scale for v, _, _ in rows],
    }
    best: tuple[float, dict[str, float]] | None = None
    for free in (("a", "c", "b"), ("c", "b"), ("a", "b"), ("b",)):
        solution = _weighted_least_squares([columns[name] for name in free], ts, weights)
        if solution is None:
            if len(free) == 3:
                return None  # the design cannot tell a fixed latency from a per-doubling one
            continue
        coefficients = dict.fromkeys("acb", 0.0) | dict(zip(free, solution, strict=True))
        if coefficients["a"] < 0 or coefficients["c"] < 0 or not coefficients["b"] > 0:
            continue
        error = sum(
            w * (t - sum(coefficients[name] * columns[name][i] for name in free)) ** 2
            for i, (w, t) in enumerate(zip(weights, ts, strict=True))
        )
        if best is None or error < best[0]:
            best = (error, coefficients)
    if best is None:
        return None
    a, c, b = best[1]["a"] * t_scale, best[1]["c"] * t_scale / l_scale, best[1]["b"] * t_scale / v_scale
    if not all(math.isfinite(x) for x in (a, c, b)):
        return None
    return a, c, b


def _weighted_least_squares(
    columns: list[list[float]], ys: list[float], weights: list[float]
) -> list[float] | None:
    """Coefficients of `columns` that minimise sum w (y - X beta)^2 (normal equations, Gaussian
    elimination with partial pivoting); None when the columns are (nearly) linearly dependent."""
    k = len(columns)
    gram = [
        [sum(w * x * z for w, x, z in zip(weights, columns[i], columns[j], strict=True)) for j in range(k)]
        for i in range(k)
    ]
    rhs = [sum(w * x * y for w, x, y in zip(weights, columns[i], ys, strict=True)) for i in range(k)]
    tolerance = 1e-10 * max(gram[i][i] for i in range(k))
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(gram[r][col]))
        if abs(gram[pivot][col]) <= tolerance:
            return None
        gram[col], gram[pivot] = gram[pivot], gram[col]
        rhs[col], rhs[pivot] = rhs[pivot], rhs[col]
        for r in range(col + 1, k):
            factor = gram[r][col] / gram[col][col]
            for j in range(col, k):
                gram[r][j] -= factor * gram[col][j]
            rhs[r] -= factor * rhs[col]
    beta = [0.0] * k
    for i in reversed(range(k)):
        beta[i] = (rhs[i] - sum(gram[i][j] * beta[j] for j in range(i + 1, k))) / gram[i][i]
    return beta


_FITTED: dict[tuple[str, str, str, str], CostParameters] = {}
"""Fits by (profile content, base parameters, precision, optimizer): the timed-step fit prices
thousands of trial steps, and every plan made with a profile needs the same fit again."""
_FITTED_LIMIT = 64


def fit_parameters(
    profile: CalibrationProfile,
    *,
    base: CostParameters,
    precision: Precision,
    optimizer: Optimizer = "adamw",
) -> CostParameters:
    """Cost parameters with every measured quantity replaced by its fit; the rest from `base`."""
    key = (profile.content_id(), repr(base), precision, optimizer)
    if key not in _FITTED:
        if len(_FITTED) >= _FITTED_LIMIT:
            _FITTED.pop(next(iter(_FITTED)))
        _FITTED[key] = _fit(profile, base=base, precision=precision, optimizer=optimizer)
    return _FITTED[key]


def _fit(
    profile: CalibrationProfile, *, base: CostParameters, precision: Precision, optimizer: Optimizer
) -> CostParameters:
    changes: dict[str, object] = {}
    dtype = "bfloat16" if precision == "bf16" else "float32"
    samples = [s for s in profile.matmul if s.dtype == dtype]
    if profile.memory_bandwidth:
        best = max(s.bytes / s.seconds for s in profile.memory_bandwidth)
        changes["memory_bandwidth"] = best
        if base.gemm_bandwidth:
            changes["gemm_bandwidth"] = best
    # time = flops / (peak * efficiency) + overhead: the launch overhead, and the large GEMMs' rate
    # for the float8 ratio; the ceiling is the GEMM curve's (planner/cost/gemm.py), fitted to every
    # compute-bound sample, and the samples themselves replace the curve at their shapes.
    line = _fit_line([(s.flops, s.seconds) for s in samples])
    if line is not None:
        overhead, seconds_per_flop = line
        points = tuple((s.m, s.n, s.k, s.seconds) for s in samples)
        curve = base.with_changes(**changes, matmul_overhead_s=overhead)
        ceiling = fit_gemm_ceiling(curve, list(points), dtype_bytes=2 if dtype == "bfloat16" else 4)
        changes["matmul_efficiency"] = ceiling or min(1.0, 1.0 / (seconds_per_flop * base.peak_flops))
        changes["matmul_overhead_s"] = overhead
        changes["gemm_points"] = points
        float8 = _fit_line([(s.flops, s.seconds) for s in profile.matmul if s.dtype in FLOAT8_GEMM_DTYPES])
        if float8 is not None and base.fp8_peak_flops and precision == "bf16":
            # The measured float8 GEMM rate against the measured bf16 one, as a share of the 2x the
            # peaks allow: what FLOAT8_GEMM_EFFICIENCY states for tensorwise from the corpus.
            ratio = seconds_per_flop / float8[1] / (base.fp8_peak_flops / base.peak_flops)
            changes["float8_gemm_efficiency"] = {**base.float8_gemm_efficiency, "tensorwise": min(1.0, ratio)}
    grouped = grouped_gemm_efficiency(profile, dtype)
    if grouped is not None:
        changes["grouped_gemm_efficiency"] = grouped

    links = dict(base.links)
    by_link: dict[LinkClass, list[tuple[float, float, int]]] = defaultdict(list)
    for c in profile.collectives:
        # An all-reduce is priced as a reduce-scatter plus an all-gather: twice the latency and
        # twice the volume, so half its time is one "pass" comparable with the others.
        passes = 2.0 if c.op == "all_reduce" else 1.0
        volume = c.bytes * (c.group_size - 1) / c.group_size
        by_link[c.link].append((volume, c.seconds / passes, c.group_size))
    for link, points in by_link.items():
        fitted_link = _fit_link(points, base.links[link])
        if fitted_link is not None:
            links[link] = fitted_link
    changes["links"] = links
    if profile.overlap_contention is not None:
        changes["overlap_contention"] = profile.overlap_contention
    fitted = base.with_changes(**changes)
    scale = _block_scale(profile, fitted, dtype)
    if scale is not None:
        fitted = fitted.with_changes(compute_scale=scale)
    # Whole steps come last: they correct what the parts fitted above leave unexplained. The
    # optimizer runs eagerly in both engines, so every step times it; eager steps without
    # checkpointing fit the compute scale and overheads (as before compiled and checkpointed
    # steps were measured), and compiled steps then fit what compilation changes on top of them.
    steps = [s for s in profile.steps if s.dtype == dtype and s.optimizer == optimizer]
    if steps and profile.model is not None:
        fitted = _fit_optimizer(profile, steps, fitted)
        eager = [s for s in steps if not s.compile and s.checkpointing == "none"]
        if eager:
            fitted = _fit_steps(profile, eager, fitted, precision)
        compiled = [s for s in steps if s.compile]
        if compiled:
            fitted = _fit_compiled(profile, compiled, fitted, precision)
    # Memory last: it prices with the same model, whatever the time fit changed.
    measured = [
        (*sample_setting(profile, s, fitted, precision), s.peak_allocated_bytes, s.peak_reserved_bytes)
        for s in steps
        if s.peak_allocated_bytes and profile.model is not None
    ]
    return fit_memory(
        measured,
        fitted,
        usable_bytes=profile.usable_memory_bytes,
        device_bytes=profile.device_memory_bytes,
        profile_id=profile.content_id(),
        allocator_config=profile.allocator_config,
    )


def grouped_gemm_efficiency(profile: CalibrationProfile, dtype: str) -> float | None:
    """The routed experts' grouped GEMM rate over the dense GEMM rate at the same shapes, as the profile
    timed it in `dtype`: the median over its points (each forward and backward together), at most 1
    (the parameter is a share of the dense rate: a median above it, which a host's timing noise at
    small shapes can give, prices the experts as dense GEMMs). None where nothing was timed in `dtype`:
    the catalog's value stays."""
    if profile.grouped_gemm is None:
        return None
    ratios = [s.efficiency for s in profile.grouped_gemm.samples if s.dtype == dtype]
    if not ratios:
        return None
    return min(1.0, statistics.median(ratios))


def _step_model(profile: CalibrationProfile, sample: StepSample) -> ModelCosts:
    assert profile.model is not None
    cut = profile.model.model_copy(update={"num_layers": sample.num_layers})
    return model_costs(cut, sample.seq_len)


def _fit_optimizer(
    profile: CalibrationProfile, steps: list[StepSample], params: CostParameters
) -> CostParameters:
    """Update time = fixed + per-parameter part, over the shard each rank updates."""
    points = [(_step_model(profile, s).num_params / _shard(s), s.update_seconds) for s in steps]
    line = _fit_line(points)
    if line is None:  # one model size only: all of it per parameter
        x, y = points[0]
        line = (0.0, y / x)
    overhead, seconds_per_param = line
    return params.with_changes(
        optimizer_overhead_s=overhead,
        optimizer_bytes_per_param=seconds_per_param * params.memory_bandwidth,
    )


def _shard(sample: StepSample) -> int:
    return sample.ranks if sample.sharding == "full_shard" else 1


def sample_setting(
    profile: CalibrationProfile, sample: StepSample, params: CostParameters, precision: Precision
) -> tuple[Setting, Choice]:
    """The cost model's view of a measured step: its cut model on its ranks, and its configuration
    (engine, checkpointing and loss slices included; compiled steps run without bucketing, as the
    profiler runs them)."""
    fp = profile.fingerprint
    setting = Setting(
        model=_step_model(profile, sample),
        params=params,
        precision=precision,
        optimizer=sample.optimizer,
        world_size=sample.ranks,
        gpus_per_node=min(fp.gpus_per_node, sample.ranks),
        num_nodes=max(1, sample.ranks // max(fp.gpus_per_node, 1)),
        seq_len=sample.seq_len,
        global_batch_sequences=sample.micro_batch_size * sample.grad_accum_steps * sample.ranks,
    )
    choice = Choice(
        sharding=sample.sharding,
        mesh=Mesh(dp_replicate=sample.ranks // _shard(sample), dp_shard=_shard(sample)),
        blocks_per_unit=1,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        checkpointing=sample.checkpointing,
        every_k=1,
        micro_batch_size=sample.micro_batch_size,
        grad_accum_steps=sample.grad_accum_steps,
        compile=sample.compile,
        loss_chunks=sample.loss_chunks,
    )
    return setting, choice


def predicted_step_time(
    profile: CalibrationProfile, sample: StepSample, params: CostParameters, precision: Precision
) -> float:
    """The cost model's step time for a timed step's model and configuration."""
    setting, choice = sample_setting(profile, sample, params, precision)
    return Estimator(setting).timing(choice).step_time_s


def _fit_steps(
    profile: CalibrationProfile, steps: list[StepSample], params: CostParameters, precision: Precision
) -> CostParameters:
    """Compute scale and per-micro-batch overheads that match the timed steps.

    Blocks timed alone miss part of what a block costs inside training (its working set spread over
    the whole model, the collectives beside it), and nothing but a whole step shows the framework
    time per micro-batch (FSDP hooks, buffer copies, loss, Python). Replicated steps at two or more
    depths set the compute scale (else all steps do; with one depth the block scale stays). The
    overhead is then solved exactly on replicated steps, and what sharded steps cost beyond it is
    the sharding overhead. Overheads stay at zero or above: a model that over-predicts is not
    corrected by negative time.
    """
    params = params.with_changes(micro_batch_overhead_s=0.0, sharding_overhead_s=0.0)

    def fit_at(trial: CostParameters, samples: list[StepSample]) -> tuple[float, float]:
        return _overhead_fit(profile, samples, trial, precision)

    replicated = [s for s in steps if s.sharding == "no_shard"]
    sharded = [s for s in steps if s.sharding != "no_shard"]
    by_depth = replicated if len({s.num_layers for s in replicated}) >= 2 else steps
    if len({s.num_layers for s in by_depth}) >= 2:
        scale = _minimize(lambda x: fit_at(params.with_changes(compute_scale=x), by_depth)[0])
        # At the edge of the search range the depths said nothing (a deeper step timed no slower
        # than a shallower one: noise); the blocks' own scale is the better evidence then.
        if SCALE_RANGE[0] * 1.01 < scale < SCALE_RANGE[1] * 0.99:
            params = params.with_changes(compute_scale=scale)
    if replicated and sharded:
        base_overhead = fit_at(params, replicated)[1]
        extra = max(0.0, fit_at(params, sharded)[1] - base_overhead)
        return params.with_changes(micro_batch_overhead_s=base_overhead, sharding_overhead_s=extra)
    return params.with_changes(micro_batch_overhead_s=fit_at(params, steps)[1])


def _overhead_fit(
    profile: CalibrationProfile, samples: list[StepSample], trial: CostParameters, precision: Precision
) -> tuple[float, float]:
    """(relative squared error, overhead per micro-batch) of `trial`, priced without the overhead
    being fitted, on `samples`: the overhead is solved exactly, and never negative (a model that
    over-predicts is not corrected by negative time)."""
    rows = [
        (s.seconds, s.grad_accum_steps, predicted_step_time(profile, s, trial, precision)) for s in samples
    ]
    numerator = sum(a * (y - p) / (y * y) for y, a, p in rows)
    denominator = sum(a * a / (y * y) for y, a, _ in rows)
    overhead = max(0.0, numerator / denominator)
    return sum(((y - p - overhead * a) / y) ** 2 for y, a, p in rows), overhead


def _fit_compiled(
    profile: CalibrationProfile, compiled: list[StepSample], params: CostParameters, precision: Precision
) -> CostParameters:
    """The compiled compute scale and per-micro-batch overhead that match the compiled steps.

    The compute scale, collectives and optimizer stay as the eager steps fitted them; what differs is
    the compute inductor fuses and schedules, and the framework time around one graph, which is not
    FSDP2's hooks (the eager overheads). Steps at one depth cannot tell a scale from an overhead, so
    the scale is pulled gently towards 1 (no change): the data decide where they can, and where they
    cannot, the overhead takes the difference rather than an implausible scale.
    """

    def fit_at(scale: float) -> tuple[float, float]:
        """(penalised relative squared error, overhead per micro-batch) with compiled scale `scale`."""
        trial = params.with_changes(compiled_compute_scale=scale, compiled_overhead_s=0.0)
        error, overhead = _overhead_fit(profile, compiled, trial, precision)
        return error + SCALE_PRIOR * math.log(scale) ** 2, overhead

    scale = _minimize(lambda x: fit_at(x)[0])
    return params.with_changes(compiled_compute_scale=scale, compiled_overhead_s=fit_at(scale)[1])


SCALE_PRIOR = 1e-4
"""Weight of (ln scale)^2 in the compiled fit: halving the scale costs less than a 1% misfit of one
step, so the data win wherever they can tell; between equally exact fits it picks the one nearest 1."""


SCALE_RANGE = (0.2, 0.2 * 1.25**20)
"""Where `_minimize` looks for a factor."""


def _minimize(error: Callable[[float], float]) -> float:
    """The positive factor (0.2 .. ~18) with the least error: a log grid, then golden-section
    refinement around the best grid point (the errors here are smooth and unimodal near it)."""
    grid = [SCALE_RANGE[0] * 1.25**i for i in range(21)]
    best = min(range(len(grid)), key=lambda i: error(grid[i]))
    low, high = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    error_a, error_b = error(a), error(b)
    for _ in range(24):  # the bracket shrinks to ~1e-5 of its width
        if error_a <= error_b:
            high, b, error_b = b, a, error_a
            a = high - ratio * (high - low)
            error_a = error(a)
        else:
            low, a, error_a = a, b, error_b
            b = low + ratio * (high - low)
            error_b = error(b)
    return (low + high) / 2


def _block_scale(profile: CalibrationProfile, params: CostParameters, dtype: str) -> float | None:
    """Median of measured / predicted block time: what GEMM and bandwidth fits leave unexplained
    (kernel launch gaps, attention, framework overhead) as one correction factor on compute."""
    if profile.model is None or profile.model.architecture == "layer_graph":
        return None
    ratios = []
    act_bytes = 2 if dtype == "bfloat16" else 4
    for sample in profile.blocks:
        if sample.dtype != dtype:
            continue
        block = model_costs(profile.model, sample.seq_len).blocks[0]
        predicted = block_step_time(
            params.with_changes(compute_scale=1.0),
            block,
            tokens=sample.micro_batch_size * sample.seq_len,
            seq_len=sample.seq_len,
            act_bytes=act_bytes,
            checkpointing=sample.checkpointing,
            compile_=sample.compile,
        )
        ratios.append(sample.seconds / predicted)
    if not ratios:
        return None
    ratios.sort()
    return ratios[len(ratios) // 2]
