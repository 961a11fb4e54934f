"""Fitting cost parameters from a CalibrationProfile, and using it in a plan."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog import resolve_gpu
from planner.cost.parameters import default_parameters
from planner.search import make_plan
from planner.specs import ClusterSpec
from tests.planner.conftest import make_request

FINGERPRINT = {
    "device_name": "NVIDIA H100 80GB HBM3",
    "device_count": 8,
    "gpus_per_node": 8,
    "backend": "nccl",
    "torch_version": "2.13.0",
}


def synthetic_profile(*, efficiency: float, overhead: float, latency: float, bandwidth: float) -> dict:
    peak = 989.4e12
    sizes = [512, 1024, 2048, 4096, 8192]
    matmul = [
        {"m": s, "n": s, "k": s, "dtype": "bfloat16", "seconds": 2 * s**3 / (peak * efficiency) + overhead}
        for s in sizes
    ]
    collectives = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        factor = 2 if op == "all_reduce" else 1
        for nbytes in (1 << 20, 1 << 24, 1 << 28, 1 << 30):
            seconds = factor * (latency + nbytes * 7 / 8 / bandwidth)
            collectives.append(
                {"op": op, "group_size": 8, "link": "intra", "bytes": nbytes, "seconds": seconds}
            )
    return {
        "name": "synthetic",
        "gpu": "H100-SXM-80GB",
        "fingerprint": dict(FINGERPRINT),
        "matmul": matmul,
        "collectives": collectives,
    }


def test_fitting_recovers_known_parameters() -> None:
    profile = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.42, overhead=15e-6, latency=30e-6, bandwidth=200e9)
    )
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")
    fitted = fit_parameters(profile, base=base, precision="bf16")
    assert fitted.matmul_efficiency == pytest.approx(0.42, rel=1e-3)
    assert fitted.matmul_overhead_s == pytest.approx(15e-6, rel=1e-3)
    assert fitted.links["intra"].bandwidth == pytest.approx(200e9, rel=1e-3)
    assert fitted.links["intra"].latency(8) == pytest.approx(30e-6, rel=1e-3)
    assert fitted.links["inter"] == base.links["inter"]  # not measured: default kept


def test_a_slow_measured_machine_changes_the_plan_where_it_should() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=32)
    default = make_plan(request)
    slow_links = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.5, overhead=8e-6, latency=50e-6, bandwidth=5e9)
    )
    calibrated = make_plan(request, calibration=slow_links, calibration_id="slow-nvlink")
    assert calibrated.calibration_id == "slow-nvlink"
    assert calibrated.plan_hash != default.plan_hash
    # With 5 GB/s links the same step spends far longer in communication ...
    assert calibrated.prediction.comm_s > 10 * default.prediction.comm_s
    assert calibrated.prediction.tokens_per_s_per_gpu < default.prediction.tokens_per_s_per_gpu


@pytest.mark.parametrize(
    "mutation",
    [
        lambda p: p["matmul"][0].update(seconds=-1.0),
        lambda p: p["collectives"][0].update(group_size=1),
        lambda p: p["fingerprint"].update(backend="carrier-pigeon"),
        lambda p: p.update(unexpected=True),
        lambda p: p["matmul"][0].update(seconds=float("nan")),
    ],
)
def test_malformed_profiles_are_refused(mutation) -> None:
    profile = synthetic_profile(efficiency=0.5, overhead=1e-5, latency=1e-5, bandwidth=1e11)
    mutation(profile)
    with pytest.raises(ValidationError):
        CalibrationProfile.model_validate(profile)


def test_a_calibrated_plan_never_shares_the_uncalibrated_hash() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=32)
    profile = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.5, overhead=8e-6, latency=20e-6, bandwidth=3e11)
    )
    calibrated = make_plan(request, calibration=profile)
    assert calibrated.calibration_id == profile.content_id()
    assert calibrated.plan_hash != make_plan(request).plan_hash
    assert make_plan(request, calibration=profile).plan_hash == calibrated.plan_hash
