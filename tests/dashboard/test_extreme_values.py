"""Pages that draw stored measurements render for every value the API accepts, and for rows stored
before it bounded them (issue 12: one run of 5e-324 s made /accuracy a 500 for everyone)."""

from __future__ import annotations

import json
import math
import re

import pytest
from fastapi.testclient import TestClient

from api.db.models import PlanRow, ValidationRunRow
from tests.dashboard.conftest import DEBUG_CPU_FORM, Database, create_plan
from tests.dashboard.figures import marks
from tests.extreme_values import EXTREME_RUNS, extreme_profile


def finite_coordinates(html: str) -> bool:
    """Every chart's figure is strict JSON (no NaN / Infinity) whose axes span a finite, non-empty range."""
    islands = re.findall(r'<script type="application/json" class="plot-figure"[^>]*>(.*?)</script>', html,
                         re.S)
    for island in islands:
        figure = json.loads(island, parse_constant=lambda name: pytest.fail(f"{name} in a chart"))
        for axis in ("xaxis", "yaxis"):
            extent = figure["layout"][axis].get("range")
            if extent is not None and not (math.isfinite(extent[0]) and extent[0] < extent[1] < math.inf):
                return False
    return bool(islands)


def test_accuracy_and_calibration_pages_draw_values_at_the_bounds(client: TestClient) -> None:
    plan_id = create_plan(client, **DEBUG_CPU_FORM)
    for body in EXTREME_RUNS:
        assert client.post(f"/api/v1/plans/{plan_id}/runs", json=body).status_code == 201
    calibration = client.post("/api/v1/calibrations", json=extreme_profile())
    assert calibration.status_code == 201, calibration.text
    calibration_id = calibration.json()["id"]

    accuracy = client.get("/accuracy")
    assert accuracy.status_code == 200
    assert marks(accuracy.text, "step-time", "circle") == len(EXTREME_RUNS)
    assert marks(accuracy.text, "memory-accuracy", "circle") == 2  # one run measured no memory
    assert finite_coordinates(accuracy.text)
    for page in ("/calibrations", f"/calibrations/{calibration_id}", f"/plans/{plan_id}"):
        response = client.get(page)
        assert response.status_code == 200, page
        assert finite_coordinates(response.text) or "plot-figure" not in response.text
    detail = client.get(f"/calibrations/{calibration_id}").text
    assert marks(detail, "matmul", "circle") == 6 and marks(detail, "collective", "circle") == 7


def test_rows_stored_before_the_bounds_do_not_break_the_accuracy_page(
    client: TestClient, db: Database
) -> None:
    plan_id = create_plan(client, **DEBUG_CPU_FORM)
    with db.session() as session:
        plan = session.get(PlanRow, plan_id)
        assert plan is not None
        for measured, error in ((5e-324, None), (5e-324, math.inf), (1e300, -100.0), (1.0, 12.5)):
            session.add(ValidationRunRow(
                plan_id=plan.id, measured_step_time_s=measured, measured_tokens_per_s_per_gpu=1.0,
                predicted_step_time_s=plan.step_time_s,
                predicted_tokens_per_s_per_gpu=plan.tokens_per_s_per_gpu,
                predicted_peak_memory_gib=plan.peak_memory_gib, step_time_error_pct=error,
                tokens_per_s_error_pct=error, raw={},
            ))
        session.commit()
    response = client.get("/accuracy")
    assert response.status_code == 200
    assert finite_coordinates(response.text)
    # The statistics use the two finite errors only.
    assert re.search(r'<th scope="row">step time</th><td class="num">2</td>', response.text)
    runs = client.get(f"/api/v1/plans/{plan_id}/runs")
    assert runs.status_code == 200
    assert [r["step_time_error_pct"] for r in runs.json()["items"]] == [12.5, -100.0, None, None]
