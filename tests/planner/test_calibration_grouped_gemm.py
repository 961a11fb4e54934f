"""The routed experts' grouped GEMMs in a calibration profile: the schema (old profiles without them
still read, with the same id) and the fit of `grouped_gemm_efficiency` from them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from planner.calibration import CalibrationProfile, fit_parameters, grouped_gemm_efficiency
from planner.catalog.gpus import resolve_gpu
from planner.cost.gemm import matmul_seconds
from planner.cost.parameters import GROUPED_MM_EFFICIENCY, default_parameters
from planner.search_setting import build_setting
from planner.specs import ClusterSpec
from tests.planner.conftest import make_request
from tests.planner.test_calibration import synthetic_profile

DENSE_TFLOPS = 600e12
"""The synthetic dense GEMM rate (FLOP/s) the grouped points are timed against."""


def grouped_point(efficiency: float, *, experts: int = 8, rows: int = 512, n: int = 2048, k: int = 7168,
                  dtype: str = "bfloat16") -> dict:
    """A timed point whose grouped GEMM runs at `efficiency` of the dense rate, forward and backward."""
    flops = 2.0 * experts * rows * n * k
    dense_forward, dense_backward = flops / DENSE_TFLOPS, 2 * flops / DENSE_TFLOPS
    return {
        "experts": experts, "rows": rows, "n": n, "k": k, "dtype": dtype,
        "forward_seconds": dense_forward / efficiency, "backward_seconds": dense_backward / efficiency,
        "dense_forward_seconds": dense_forward, "dense_backward_seconds": dense_backward,
    }


def profile_with(grouped: dict | None) -> CalibrationProfile:
    document = synthetic_profile(efficiency=0.6, overhead=8e-6, latency=30e-6, bandwidth=200e9)
    if grouped is not None:
        document["grouped_gemm"] = grouped
    return CalibrationProfile.model_validate(document)


H100 = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")


def test_the_efficiency_is_the_median_measured_share_of_the_dense_rate() -> None:
    points = [grouped_point(0.30, experts=64, rows=128), grouped_point(0.40, experts=16),
              grouped_point(0.55, experts=2, rows=4096, n=7168, k=2048)]
    profile = profile_with({"samples": points})
    assert profile.grouped_gemm.samples[1].efficiency == pytest.approx(0.40)
    fitted = fit_parameters(profile, base=H100, precision="bf16")
    assert fitted.grouped_gemm_efficiency == pytest.approx(0.40)
    # An even count takes the middle two's mean; the dense GEMMs' own fit is untouched by them.
    four = profile_with({"samples": [*points, grouped_point(0.50)]})
    assert grouped_gemm_efficiency(four, "bfloat16") == pytest.approx(0.45)
    assert fitted.matmul_efficiency == fit_parameters(profile_with(None), base=H100,
                                                      precision="bf16").matmul_efficiency


def test_only_points_of_the_plans_dtype_count_and_the_share_stays_at_most_one() -> None:
    profile = profile_with({"samples": [grouped_point(0.5), grouped_point(0.9, dtype="float32")]})
    assert grouped_gemm_efficiency(profile, "bfloat16") == pytest.approx(0.5)
    assert grouped_gemm_efficiency(profile, "float32") == pytest.approx(0.9)
    faster = profile_with({"samples": [grouped_point(1.3), grouped_point(1.1)]})
    assert grouped_gemm_efficiency(faster, "bfloat16") == 1.0


@pytest.mark.parametrize("grouped", [None, {"samples": []},
                                     {"samples": [], "not_measured": "torch 2.5 has no torch._grouped_mm"},
                                     {"samples": [grouped_point(0.3, dtype="float32")]}])
def test_without_grouped_points_in_the_plans_dtype_the_default_stays(grouped: dict | None) -> None:
    fitted = fit_parameters(profile_with(grouped), base=H100, precision="bf16")
    assert fitted.grouped_gemm_efficiency == H100.grouped_gemm_efficiency == GROUPED_MM_EFFICIENCY


def test_profiles_round_trip_with_and_without_the_grouped_gemms() -> None:
    older = profile_with(None)
    assert older.grouped_gemm is None
    assert "grouped_gemm" not in older.model_dump(exclude_none=True)
    # A profile written before the field existed keeps its id; one that timed the experts has its own.
    with_points = profile_with({"samples": [grouped_point(0.4)]})
    assert with_points.content_id() != older.content_id()
    unset = older.model_copy(update={"grouped_gemm": None})
    assert unset.content_id() == older.content_id()
    for profile in (older, with_points, profile_with({"samples": [], "not_measured": "no kernel"})):
        again = CalibrationProfile.model_validate_json(profile.model_dump_json())
        assert again == profile and again.content_id() == profile.content_id()
    assert again.grouped_gemm is not None and again.grouped_gemm.not_measured == "no kernel"


@pytest.mark.parametrize("change", [
    {"forward_seconds": -1.0},
    {"dense_backward_seconds": float("nan")},
    {"experts": 0},
    {"dtype": "int8"},
    {"forward_seconds": 1e-7},  # 2 x 8 x 512 x 2048 x 7168 FLOPs in 100 ns: past any accelerator
    {"unexpected": 1},
])
def test_impossible_grouped_points_are_refused(change: dict) -> None:
    with pytest.raises(ValidationError):
        profile_with({"samples": [grouped_point(0.4) | change]})


def test_a_calibrated_moe_plan_prices_its_experts_at_the_measured_share() -> None:
    request = make_request("qwen3-30b-a3b", "1x8xH100", seq_len=4096, sequences=32)
    profile = profile_with({"samples": [grouped_point(0.25), grouped_point(0.3)]})
    setting = build_setting(request, profile)
    assert setting.params.grouped_gemm_efficiency == pytest.approx(0.275)
    assert build_setting(request, profile_with(None)).params.grouped_gemm_efficiency == GROUPED_MM_EFFICIENCY
    # The experts' GEMMs of an MoE block take longer at the lower measured share.
    block = next(b for b in setting.model.blocks if b.routed_experts)
    default = build_setting(request).params
    assert matmul_seconds(setting.params, block, 8192, dtype_bytes=2) > matmul_seconds(
        default, block, 8192, dtype_bytes=2
    )
