"""Calibration fits are safe for every profile the schema accepts: degenerate data (one point, equal
sizes, equal times) and values at the physical bounds give finite parameters or leave the default,
never an exception (issue 12: a collective of 1e200 s was a ZeroDivisionError in the line fit)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.bounds import MAX_BYTES_PER_S, MAX_SECONDS, MIN_KERNEL_SECONDS
from planner.calibration import CalibrationProfile, _fit_latency_plane, _fit_line, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.cost.parameters import default_parameters
from planner.specs import ClusterSpec
from tests.extreme_values import extreme_profile

SECONDS = st.floats(min_value=MIN_KERNEL_SECONDS, max_value=MAX_SECONDS)
SIZES = st.floats(min_value=0.0, max_value=2e36)  # 2·m·n·k of the largest GEMM the schema allows


def finite(document: object) -> bool:
    if isinstance(document, float):
        return math.isfinite(document)
    if isinstance(document, dict):
        return all(finite(v) for v in document.values())
    return True


@settings(max_examples=300, derandomize=True, database=None)
@given(st.lists(st.tuples(SIZES, SECONDS), max_size=12))
def test_a_line_fit_is_finite_or_none(points: list[tuple[float, float]]) -> None:
    fitted = _fit_line(points)
    if fitted is not None:
        latency, slope = fitted
        assert math.isfinite(latency) and latency >= 0
        assert math.isfinite(slope) and slope > 0


@pytest.mark.parametrize(
    "points",
    [
        [],
        [(1e6, 1.0)],  # one point
        [(1e6, 1.0), (1e6, 2.0), (1e6, 3.0)],  # all sizes equal
        [(0.0, 1.0), (0.0, 1.0)],  # zero sizes
        [(1.0, 1e200), (2.0, 1e200)],  # issue 12's timing (refused by the schema today)
        [(1.0, 5e-324), (2.0, 5e-324)],
        [(1.0, 2.0), (2.0, 1.0)],  # faster when bigger: no positive slope
    ],
)
def test_degenerate_points_give_no_line(points: list[tuple[float, float]]) -> None:
    assert _fit_line(points) is None


@settings(max_examples=300, derandomize=True, database=None)
@given(st.lists(st.tuples(SIZES, SECONDS, st.sampled_from([2, 4, 8, 64])), max_size=12))
def test_a_latency_plane_fit_is_finite_or_none(points: list[tuple[float, float, int]]) -> None:
    fitted = _fit_latency_plane(points)
    if fitted is not None:
        latency, per_log2, slope = fitted
        assert math.isfinite(latency) and latency >= 0
        assert math.isfinite(per_log2) and per_log2 >= 0
        assert math.isfinite(slope) and slope > 0


def test_extremes_far_apart_still_fit() -> None:
    # y = 1e-7 + 1e-6 x, from 1.1 µs at one byte to 11.6 days at a terabyte.
    points = [(x, 1e-7 + 1e-6 * x) for x in (1.0, 1e12)]
    latency, slope = _fit_line(points) or (None, None)
    assert latency == pytest.approx(1e-7, rel=1e-3) and slope == pytest.approx(1e-6, rel=1e-6)


@st.composite
def bounded_profiles(draw: st.DrawFn) -> CalibrationProfile:
    """Profiles of arbitrary GEMM, copy and collective samples within the schema's bounds."""
    dims = st.integers(min_value=1, max_value=4096)
    matmul = []
    for m, n, k, seconds in draw(st.lists(st.tuples(dims, dims, dims, SECONDS), max_size=5)):
        matmul.append({"m": m, "n": n, "k": k, "dtype": "float32",
                       "seconds": max(seconds, 2 * m * n * k / 1e17)})
    collectives = []
    sizes = st.integers(min_value=1, max_value=10**12)
    # Several group sizes on one link take the fit that reads latency growth from them.
    for op, group, size, seconds in draw(st.lists(st.tuples(
        st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"]), st.sampled_from([2, 4, 8]),
        sizes, SECONDS
    ), max_size=8)):
        collectives.append({"op": op, "group_size": group, "link": "intra", "bytes": size,
                            "seconds": max(seconds, 2 * size / MAX_BYTES_PER_S)})
    copies = [{"bytes": b, "seconds": max(s, b / MAX_BYTES_PER_S)}
              for b, s in draw(st.lists(st.tuples(sizes, SECONDS), max_size=2))]
    profile = extreme_profile(matmul=matmul, collectives=collectives, memory_bandwidth=copies,
                              model=None, blocks=[], steps=[])
    return CalibrationProfile.model_validate(profile)


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(bounded_profiles())
def test_any_bounded_profile_fits_finite_parameters(profile: CalibrationProfile) -> None:
    gpu = resolve_gpu("cpu")
    base = default_parameters(gpu, ClusterSpec(num_nodes=1, gpus_per_node=2, gpu=gpu.name), "fp32")
    fitted = fit_parameters(profile, base=base, precision="fp32").as_document()
    assert finite(fitted)
    assert 0 < fitted["matmul_efficiency"] <= 1
    intra = fitted["links"]["intra"]
    assert 0 < intra["bandwidth"] <= MAX_BYTES_PER_S
    assert intra["latency_s"] >= 0 and intra["latency_per_log2_s"] >= 0


def test_the_extreme_profile_with_steps_fits_finite_parameters() -> None:
    profile = CalibrationProfile.model_validate(extreme_profile())
    gpu = resolve_gpu("cpu")
    for precision in ("fp32", "bf16"):
        base = default_parameters(gpu, ClusterSpec(num_nodes=1, gpus_per_node=2, gpu=gpu.name), precision)
        assert finite(fit_parameters(profile, base=base, precision=precision).as_document())
