"""What the calibration pages show: a profile's hardware, its measured curves, and the fitted parameters.

Curves are derived from the raw samples of the stored `CalibrationProfile` document:
- matmul efficiency: achieved FLOP/s (2·m·n·k / seconds) over the GPU's datasheet peak for the dtype;
- collective bus bandwidth: bytes · (n-1)/n / seconds (twice that volume for an all-reduce, which moves
  the data once to reduce-scatter and once to all-gather), the quantity `nccl-tests` reports.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.dashboard import charts
from api.dashboard import formatting as fmt
from api.dashboard.plan_views import Row
from api.db.models import CalibrationProfileRow
from planner.calibration import CalibrationProfile, CollectiveSample, MatmulSample
from planner.catalog.gpus import GpuSpec
from planner.cost.gemm import curve_seconds
from planner.cost.parameters import QUOTED_GROUP_SIZE, LinkParameters

DTYPE_COLORS = {"bfloat16": charts.PALETTE[0], "float16": charts.PALETTE[2], "float32": charts.PALETTE[1]}
FIT_COLORS = {"bfloat16": "#003f6b", "float16": "#00593f", "float32": "#8a5f00"}
# Fitted parameters are stored per planner precision; the profile names torch dtypes.
PRECISION_OF_DTYPE = {"bfloat16": "bf16", "float32": "fp32"}


class UnreadableProfileError(ValueError):
    """A stored profile that this version's CalibrationProfile model rejects."""


def read_profile(row: CalibrationProfileRow) -> CalibrationProfile:
    try:
        return CalibrationProfile.model_validate(row.profile)
    except ValidationError as exc:
        raise UnreadableProfileError(
            f"calibration profile {row.id} was stored in a format this version cannot show "
            f"({exc.error_count()} problem(s)); upload it again with `fsdp-planner calibrate`"
        ) from None


def hardware_label(fingerprint: dict[str, Any]) -> str:
    """`NVIDIA H100 80GB HBM3 × 8 (1 × 8, nccl, NV18)` from a stored fingerprint (any keys may be missing)."""
    device = fingerprint.get("device_name", "unknown device")
    nodes, per_node = fingerprint.get("num_nodes", 1), fingerprint.get("gpus_per_node", 1)
    extras = ", ".join(str(fingerprint[k]) for k in ("backend", "link_class") if fingerprint.get(k))
    layout = f"{nodes} × {per_node}" + (f", {extras}" if extras else "")
    return f"{device} × {fingerprint.get('device_count', '?')} ({layout})"


def fingerprint_rows(profile: CalibrationProfile) -> list[Row]:
    fp = profile.fingerprint
    gpu = profile.catalog_gpu()
    return [
        Row("Device", fp.device_name, f"catalog GPU: {gpu.name}" if gpu else "no catalog GPU named"),
        Row("Ranks", f"{fp.device_count}", f"{fp.num_nodes} node(s) × {fp.gpus_per_node} per node"),
        Row("Backend / links", f"{fp.backend} / {fp.link_class}"),
        Row("Versions", f"torch {fp.torch_version}",
            ", ".join(f"{k} {v}" for k, v in (("CUDA", fp.cuda_version), ("NCCL", fp.nccl_version)) if v)),
        Row("Samples", f"{len(profile.matmul)} GEMM, {len(profile.collectives)} collective",
            f"{len(profile.memory_bandwidth)} memory-bandwidth, {len(profile.blocks)} model-block, "
            f"{len(profile.steps)} training-step"),
        Row("Overlap contention", "not measured" if profile.overlap_contention is None
            else f"{profile.overlap_contention:.1%} compute slowdown beside a collective"),
        *_grouped_gemm_rows(profile),
        _memory_row(profile),
    ]


def _grouped_gemm_rows(profile: CalibrationProfile) -> list[Row]:
    """A mixture of experts' grouped GEMMs against dense ones of the same work (none for a dense model)."""
    grouped = profile.grouped_gemm
    if grouped is None:
        return []
    label = "Grouped GEMM (routed experts)"
    if not grouped.samples:
        return [Row(label, "not measured", grouped.not_measured or "")]
    ratios = sorted(s.efficiency for s in grouped.samples)
    dtypes = ", ".join(sorted({s.dtype for s in grouped.samples}))
    return [Row(label, f"{ratios[len(ratios) // 2]:.0%} of the dense GEMM rate (median)",
                f"{len(ratios)} points in {dtypes}, {ratios[0]:.0%} to {ratios[-1]:.0%}")]


def _memory_row(profile: CalibrationProfile) -> Row:
    """Usable device memory and the largest training-step peak the profile measured."""
    usable, total = profile.usable_memory_bytes, profile.device_memory_bytes
    capacity = (
        f"{fmt.binary_bytes(usable)} usable" + (f" of {fmt.binary_bytes(total)}" if total else "")
        if usable is not None
        else "capacity not measured"
    )
    peaks = [s.peak_allocated_bytes for s in profile.steps if s.peak_allocated_bytes is not None]
    measured = (
        f"training-step peaks measured in {len(peaks)} of {len(profile.steps)} steps, "
        f"largest {fmt.binary_bytes(max(peaks))}"
        if peaks
        else "no training-step peaks measured"
    )
    return Row("Device memory", capacity, measured)


def peak_flops(gpu: GpuSpec, dtype: str) -> float:
    return (gpu.peak_fp32_tflops if dtype == "float32" else gpu.peak_bf16_tflops) * 1e12


def _matmul_point(sample: MatmulSample, gpu: GpuSpec | None) -> charts.Point:
    achieved = sample.flops / sample.seconds
    shape = f"{sample.m}×{sample.k} @ {sample.k}×{sample.n} {sample.dtype}"
    if gpu is None:
        return charts.Point(sample.flops, achieved, f"{shape}: {fmt.compact_number(achieved)}FLOP/s")
    efficiency = achieved / peak_flops(gpu, sample.dtype)
    return charts.Point(sample.flops, efficiency,
                     f"{shape}: {fmt.compact_number(achieved)}FLOP/s = {efficiency:.1%} of peak, "
                     f"{fmt.duration(sample.seconds)}")


def _fitted_matmul_curve(
    fitted: dict[str, Any] | None, dtype: str, flops: list[float], gpu: GpuSpec
) -> list[charts.Point]:
    """Efficiency the fitted model predicts for square GEMMs (planner/cost/gemm.py's curve: the fitted
    ceiling and launch overhead, the GPU's SMs and bandwidth), if stored."""
    params = (fitted or {}).get(PRECISION_OF_DTYPE.get(dtype, ""))
    try:
        efficiency = float(params["matmul_efficiency"])
        overhead = float(params["matmul_overhead_s"])
        # Parameters stored before the curve had no SM count or GEMM bandwidth: a flat ceiling.
        sms = int(params.get("sm_count", 0))
        bandwidth = float(params.get("gemm_bandwidth", 0.0))
    except (TypeError, KeyError, ValueError, AttributeError):
        return []
    # Stored by another version, the document may hold anything: draw no curve rather than divide by 0.
    if not (0 < efficiency <= 1 and 0 <= overhead < math.inf and 0 <= sms <= 10_000
            and 0 <= bandwidth < math.inf):
        return []
    peak = peak_flops(gpu, dtype)
    dtype_bytes = 4 if dtype == "float32" else 2
    lo, hi = min(flops), max(flops)
    steps = 40
    points = []
    for i in range(steps + 1):
        f = lo * (hi / lo) ** (i / steps) if hi > lo else lo
        size = max(1, round((f / 2.0) ** (1.0 / 3.0)))
        seconds = curve_seconds(
            size, size, size, rate=peak * efficiency, bandwidth=bandwidth, sms=sms, overhead=overhead,
            dtype_bytes=dtype_bytes,
        )
        f = 2.0 * size**3
        predicted = f / seconds / peak
        points.append(charts.Point(f, predicted, f"fit: {predicted:.1%} at {fmt.compact_number(f)}FLOP"))
    return points


def matmul_chart(profile: CalibrationProfile, fitted: dict[str, Any] | None) -> charts.Chart | None:
    if not profile.matmul:
        return None
    gpu = profile.catalog_gpu()
    by_dtype: dict[str, list[MatmulSample]] = defaultdict(list)
    for sample in profile.matmul:
        by_dtype[sample.dtype].append(sample)
    series = []
    for dtype, samples in sorted(by_dtype.items()):
        series.append(charts.Series(f"measured {dtype}", [_matmul_point(s, gpu) for s in samples],
                                 DTYPE_COLORS[dtype]))
        if gpu is not None:
            curve = _fitted_matmul_curve(fitted, dtype, [s.flops for s in samples], gpu)
            if curve:
                series.append(charts.Series(f"fitted {dtype}", curve, FIT_COLORS[dtype], markers=False,
                                         line=True, css_class="fit"))
    measured = [p.y for s in series for p in s.points]
    return charts.xy_chart(
        chart_id="matmul-chart", title="GEMM efficiency vs size",
        series=series, x_label="FLOPs per GEMM (2·m·n·k)", x_log=True,
        y_label="achieved / datasheet peak" if gpu else "achieved FLOP/s",
        y_format=axis_percent if gpu else fmt.compact_number,
        y_log=gpu is None and charts.should_use_log(measured), y_from_zero=gpu is not None,
    )


def axis_percent(value: float) -> str:
    return f"{value:.0%}"


def bus_bandwidth(sample: CollectiveSample) -> float:
    """Bytes/s of bus bandwidth, comparable across ops and group sizes."""
    return sample.bus_bytes / sample.seconds


def collective_chart(profile: CalibrationProfile) -> charts.Chart | None:
    if not profile.collectives:
        return None
    groups: dict[tuple[str, str, int], list[CollectiveSample]] = defaultdict(list)
    for sample in profile.collectives:
        groups[(sample.op, sample.link, sample.group_size)].append(sample)
    series = []
    for index, ((op, link, size), samples) in enumerate(sorted(groups.items())):
        points = [
            charts.Point(s.bytes, bus_bandwidth(s) / 1e9,
                      f"{op} over {size} ranks ({link}): {fmt.binary_bytes(s.bytes)} in "
                      f"{fmt.duration(s.seconds)} = {bus_bandwidth(s) / 1e9:.3g} GB/s bus bandwidth")
            for s in samples
        ]
        series.append(charts.Series(f"{op.replace('_', '-')} ×{size} {link}", points,
                                 charts.PALETTE[index % len(charts.PALETTE)], line=True))
    bandwidths = [p.y for s in series for p in s.points]
    return charts.xy_chart(
        chart_id="collective-chart", title="Collective bus bandwidth vs message size",
        series=series, x_label="message size", x_format=fmt.binary_bytes, x_log=True,
        x_binary=True,
        y_label="bus bandwidth (GB/s)", y_log=charts.should_use_log(bandwidths, ratio=100),
        y_from_zero=not charts.should_use_log(bandwidths, ratio=100),
    )


@dataclass(frozen=True)
class FittedCell:
    """One precision's value of a parameter: the fitted one, or the catalog's that nothing replaced."""

    value: str
    measured: bool
    """False when the profile held nothing that fits it (e.g. no bfloat16 GEMM): plans use the catalog
    value, shown in the catalog column; the fitted column says so instead of repeating it."""


@dataclass(frozen=True)
class FittedRow:
    label: str
    cells: tuple[tuple[FittedCell, str], ...]
    """Per precision of `FittedTable.precisions`: (fitted, catalog)."""


@dataclass(frozen=True)
class FittedTable:
    """The fitted cost parameters beside the catalog defaults they replace, one column pair per precision."""

    precisions: tuple[str, ...]
    rows: tuple[FittedRow, ...]
    notes: tuple[str, ...]
    """Per precision whose dtype the profile never ran: that nothing dtype-dependent was measured."""


Reader = Callable[[dict[str, Any] | None], float | None]
"""Reads one parameter from a stored fit (None when the document lacks it)."""


def _get(document: dict[str, Any] | None, *path: str) -> float | None:
    value: Any = document
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _quoted_latency(link: str) -> Reader:
    """A link's latency at `QUOTED_GROUP_SIZE` ranks, as `fsdp-planner calibrate` prints it."""

    def read(document: dict[str, Any] | None) -> float | None:
        base = _get(document, "links", link, "latency_s")
        per_doubling = _get(document, "links", link, "latency_per_log2_s")
        if base is None or per_doubling is None:
            return None
        return LinkParameters(base, per_doubling, bandwidth=0.0).latency(QUOTED_GROUP_SIZE)

    return read


def _at(*path: str) -> Reader:
    return lambda document: _get(document, *path)


_FITTED_FIELDS: tuple[tuple[str, Reader, Callable[[float], str]], ...] = (
    ("GEMM efficiency", _at("matmul_efficiency"), lambda v: f"{v:.1%}"),
    ("GEMM overhead", _at("matmul_overhead_s"), fmt.duration),
    ("Memory bandwidth", _at("memory_bandwidth"), lambda v: f"{v / 1e9:,.0f} GB/s"),
    ("Intra-node bus bandwidth", _at("links", "intra", "bandwidth"), lambda v: f"{v / 1e9:,.1f} GB/s"),
    (f"Intra-node latency at {QUOTED_GROUP_SIZE} ranks", _quoted_latency("intra"), fmt.duration),
    # Read from collectives at several group sizes (the TP sizes): part of the latency may be here.
    ("Intra-node latency per group doubling", _at("links", "intra", "latency_per_log2_s"), fmt.duration),
    ("Inter-node bus bandwidth", _at("links", "inter", "bandwidth"), lambda v: f"{v / 1e9:,.1f} GB/s"),
    (f"Inter-node latency at {QUOTED_GROUP_SIZE} ranks", _quoted_latency("inter"), fmt.duration),
    ("Inter-node latency per group doubling", _at("links", "inter", "latency_per_log2_s"), fmt.duration),
    ("Overlap contention", _at("overlap_contention"), lambda v: f"{v:.1%}"),
    ("Grouped GEMM efficiency (routed experts)", _at("grouped_gemm_efficiency"), lambda v: f"{v:.1%}"),
    ("Compute scale", _at("compute_scale"), lambda v: f"{v:.3g}×"),
    ("Compiled compute scale", _at("compiled_compute_scale"), lambda v: f"{v:.3g}×"),
    ("Optimizer traffic", _at("optimizer_bytes_per_param"), lambda v: f"{v:,.0f} B/parameter"),
    ("Optimizer overhead", _at("optimizer_overhead_s"), fmt.duration),
    ("Overhead per micro-batch", _at("micro_batch_overhead_s"), fmt.duration),
    ("Sharding overhead per micro-batch", _at("sharding_overhead_s"), fmt.duration),
    ("Compiled overhead per micro-batch", _at("compiled_overhead_s"), fmt.duration),
    ("Activation memory, eager", _at("activation_memory_scale"), lambda v: f"{v:.3g}×"),
    ("Activation memory, compiled", _at("compiled_activation_memory_scale"), lambda v: f"{v:.3g}×"),
    ("Allocator reserve", _at("allocator_reserve"), lambda v: f"{v:.1%}"),
    ("Memory margin", _at("memory_margin"), lambda v: f"{v:.1%}"),
)


def fitted_table(profile: CalibrationProfile, fitted: dict[str, Any] | None) -> FittedTable | None:
    """The stored fit per precision beside the catalog defaults it started from; None when none is stored."""
    precisions = tuple(p for p in ("bf16", "fp32") if isinstance((fitted or {}).get(p), dict))
    if not precisions:
        return None
    rows = []
    for label, read, show in _FITTED_FIELDS:
        cells = []
        for precision in precisions:
            value, default = read(fitted[precision]), read((fitted or {}).get(f"{precision}_catalog"))
            shown = show(value) if value is not None else "–"
            cells.append((FittedCell(shown, measured=value is not None and value != default),
                          show(default) if default is not None else "–"))
        if any(cell.value != "–" for cell, _ in cells):
            rows.append(FittedRow(label, tuple(cells)))
    ran = {s.dtype for s in (*profile.matmul, *profile.blocks, *profile.steps)}
    notes = tuple(
        f"Nothing in this profile ran in {dtype} (GEMMs, model blocks, training steps): its {precision} "
        "values are the catalog's, except those that do not depend on the dtype (collectives, memory "
        "bandwidth, overlap contention)."
        for dtype, precision in PRECISION_OF_DTYPE.items() if precision in precisions and dtype not in ran
    )
    return FittedTable(precisions, tuple(rows), notes)
