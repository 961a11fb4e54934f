"""The step timeline stays readable at any scale: every span for small plans, one block per phase
(compute, exposed waits, all-gathers, reductions) for a 405B plan's hundreds of units."""

from __future__ import annotations

import html

from fastapi.testclient import TestClient

from planner.formatting import duration
from tests.dashboard.conftest import create_plan
from tests.dashboard.figures import figure_html as figure
from tests.dashboard.figures import marks, plot, traces

LLAMA_405B = {"model": "llama3.1-405b", "cluster": "128x8xH100",
              "training": {"seq_len": 2048, "global_batch_tokens": 2048 * 2048},
              # Without a pipeline: one rank holds all 126 blocks (a pipeline rank holds a few);
              # compiled at tp 2, whose reductions take a block wide enough to name itself.
              "search": {"pipeline_parallel_degrees": [1], "tensor_parallel_degrees": [2], "compile": [True]}}


def test_a_405b_timeline_is_drawn_per_phase(client: TestClient) -> None:
    created = client.post("/api/v1/plans", json=LLAMA_405B)
    assert created.status_code == 201, created.text
    plan = created.json()["plan"]
    timeline = plan["prediction"]["timeline"]
    assert len(timeline) > 500  # the stripes of issue 12: one span per unit and transfer

    page = client.get(f"/plans/{created.json()['id']}")
    assert page.status_code == 200
    chart = figure(page.text, "timeline")
    assert "per phase" in chart and "too many to draw one by one" in chart
    # A handful of readable blocks instead of hundreds of slivers, each named inside.
    assert 4 <= marks(page.text, "timeline", "rect") <= 12
    figure_ = plot(page.text, "timeline")
    step = figure_["layout"]["xaxis"]["range"][1]
    widths = [w for trace in traces(figure_) for w in trace["x"]]
    assert min(widths) >= step * 0.005  # every block wide enough to point at
    labels = [html.unescape(text) for trace in traces(figure_) for text in trace["text"] if text]
    # Blocks wide enough name themselves (a narrow one keeps its name in the tooltip and the legend).
    assert any(label.startswith("backward ") for label in labels), labels
    assert any(label.startswith("reduce ") for label in labels), labels
    exposed = traces(figure_, "exposed")
    assert exposed and all("phase" in t["meta"]["class"] for t in exposed)

    # The blocks keep the totals: each phase's compute and waits are the plan's own sums.
    for phase in ("forward", "backward"):
        compute = sum(s["end_s"] - s["start_s"] for s in timeline
                      if s["phase"] == phase and s["stream"] == "compute")
        waits = sum(s["exposed_s"] for s in timeline if s["phase"] == phase and s["stream"] == "comm")
        tooltips = html.unescape(chart)
        assert f"{phase} compute: " in tooltips and f"{duration(compute)} in all" in tooltips
        if waits:
            assert f"{phase}: compute waits {duration(waits)} for communication" in tooltips


def test_a_small_plan_keeps_every_span(client: TestClient) -> None:
    plan_id = create_plan(client)
    timeline = client.get(f"/api/v1/plans/{plan_id}").json()["plan"]["prediction"]["timeline"]
    page = client.get(f"/plans/{plan_id}").text
    chart = figure(page, "timeline")
    assert "per phase" not in chart
    assert not any(text for trace in traces(plot(page, "timeline")) for text in trace["text"])
    # One mark per span (pure waits move to the compute lane; partly exposed transfers add one).
    assert marks(page, "timeline", "rect") >= len(timeline)
