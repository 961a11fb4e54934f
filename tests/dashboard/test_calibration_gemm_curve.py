"""The calibration page's fitted GEMM curve is the curve plans are priced with (planner/cost/gemm.py)."""

from __future__ import annotations

import pytest

from api.dashboard.calibration_views import _fitted_matmul_curve
from planner.catalog.gpus import resolve_gpu
from planner.cost.gemm import gemm_seconds
from planner.cost.parameters import default_parameters
from planner.specs import ClusterSpec

H100 = resolve_gpu("H100")


def fitted_document(**changes: object) -> dict:
    """Fitted parameters as a stored calibration holds them (CostParameters.as_document, per precision)."""
    base = default_parameters(H100, ClusterSpec.parse("1x8xH100"), "bf16")
    return {"bf16": base.with_changes(**changes).as_document()}


def test_the_drawn_curve_is_the_priced_one_at_square_shapes() -> None:
    document = fitted_document(matmul_efficiency=0.6, matmul_overhead_s=12e-6)
    params = default_parameters(H100, ClusterSpec.parse("1x8xH100"), "bf16").with_changes(
        matmul_efficiency=0.6, matmul_overhead_s=12e-6
    )
    points = _fitted_matmul_curve(document, "bfloat16", [2.0 * 256**3, 2.0 * 16384**3], H100)
    assert len(points) == 41
    peak = H100.peak_bf16_tflops * 1e12
    for point in points:
        size = round((point.x / 2.0) ** (1.0 / 3.0))
        priced = gemm_seconds(params, size, size, size, dtype_bytes=2)
        assert point.y == pytest.approx(point.x / priced / peak, rel=1e-9)
    # Small GEMMs reach little of the ceiling; the largest nearly all of it (132 SMs, 128 x 256 tiles).
    assert points[0].y < 0.1 < 0.5 < points[-1].y <= 0.6


def test_parameters_stored_before_the_curve_draw_a_flat_ceiling() -> None:
    document = fitted_document(matmul_efficiency=0.6, matmul_overhead_s=0.0)
    for key in ("sm_count", "gemm_bandwidth", "gemm_points"):
        del document["bf16"][key]
    points = _fitted_matmul_curve(document, "bfloat16", [2.0 * 512**3, 2.0 * 8192**3], H100)
    assert all(point.y == pytest.approx(0.6) for point in points)


@pytest.mark.parametrize("value", [-1, "many", None, float("inf")])
def test_a_stored_document_holding_anything_draws_no_curve_rather_than_failing(value: object) -> None:
    document = fitted_document()
    document["bf16"]["sm_count" if value != float("inf") else "gemm_bandwidth"] = value
    assert _fitted_matmul_curve(document, "bfloat16", [1e9, 1e12], H100) == []
