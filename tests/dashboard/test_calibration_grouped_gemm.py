"""Where a calibration lists what it measured (`fsdp-planner calibrate`'s table, the calibration page), a
mixture of experts' grouped GEMMs and the efficiency they set appear; a dense model's profile shows none."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from rich.console import Console

from api.cli.calibrate_cmd import show_fit
from planner.calibration import CalibrationProfile
from tests.api.conftest import cpu_profile
from tests.dashboard.test_pages import fitted_cells


def grouped_point(efficiency: float) -> dict:
    """A float32 point (what a CPU profile times) at `efficiency` of the dense rate."""
    dense_forward = 2.0 * 4 * 64 * 128 * 256 / 40e9
    return {
        "experts": 4, "rows": 64, "n": 128, "k": 256, "dtype": "float32",
        "forward_seconds": dense_forward / efficiency, "backward_seconds": 2 * dense_forward / efficiency,
        "dense_forward_seconds": dense_forward, "dense_backward_seconds": 2 * dense_forward,
    }


def table(profile: dict) -> str:
    console = Console(record=True, width=200)
    show_fit(CalibrationProfile.model_validate(profile), console)
    return console.export_text()


def test_calibrate_lists_the_grouped_gemm_efficiency_it_measured() -> None:
    measured = table(cpu_profile(grouped_gemm={"samples": [grouped_point(0.3), grouped_point(0.5),
                                                           grouped_point(0.4)]}))
    row = r"grouped GEMM efficiency \(routed experts\)\s*│\s*0\.45\s*│\s*"
    assert re.search(row + r"0\.40", measured), measured
    assert "grouped GEMM" not in table(cpu_profile())  # a dense model: nothing to time
    reason = "torch 2.5 has no torch._grouped_mm [CPU]"
    unmeasured = table(cpu_profile(grouped_gemm={"samples": [], "not_measured": reason}))
    assert re.search(row + r"0\.45", unmeasured), unmeasured
    assert f"grouped GEMM not measured ({reason})" in unmeasured


def test_the_calibration_page_shows_the_timed_points_and_the_fitted_share(client: TestClient) -> None:
    created = client.post("/api/v1/calibrations", json=cpu_profile(
        grouped_gemm={"samples": [grouped_point(0.3), grouped_point(0.5), grouped_point(0.4)]}))
    assert created.status_code == 201, created.text
    html = client.get(f"/calibrations/{created.json()['id']}").text
    assert "40% of the dense GEMM rate (median)" in html and "3 points in float32, 30% to 50%" in html
    bf16_fitted, bf16_catalog, fp32_fitted, fp32_catalog = fitted_cells(
        html, "Grouped GEMM efficiency (routed experts)")
    assert (fp32_fitted, fp32_catalog) == ("40.0%", "45.0%")
    assert bf16_fitted == "not measured" and bf16_catalog == "45.0%"  # no bfloat16 points
    dense = client.post("/api/v1/calibrations", json=cpu_profile(name="dense"))
    assert "Grouped GEMM (routed experts)" not in client.get(f"/calibrations/{dense.json()['id']}").text
