"""A what-if study in a real browser: created through the form (the page follows its job to the end), its
chart drawn by plotly.js with one point per cluster that fits, hover naming the cluster and its
configuration, a click opening its plan."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.dashboard.conftest import BrowserPage, LiveServer
from tests.dashboard.layout import axis_title_overlaps, marks_inside_ticks, width_share
from tests.dashboard.test_browser import MARKER_CENTRE, chart_marks, hover_text

pytestmark = pytest.mark.browser


def test_study_from_the_form_to_a_plan_through_the_chart(live_server: LiveServer, page: BrowserPage) -> None:
    p = page.page
    p.goto(live_server.url + "/studies")
    assert p.locator("#empty-studies").is_visible()
    p.click("text=New study")
    p.wait_for_url("**/studies/new")
    p.select_option("#model", "gpt2")
    p.fill("#token_budget", "10B")
    p.fill("#name", "gpt2 on H100 or A100")
    assert p.locator("#gpu-H100-SXM-80GB").is_checked() and p.locator("#gpu-A100-80GB").is_checked()
    p.fill("#price_H100-SXM-80GB", "2.5")
    p.fill("#sizes", "1,8,12,16")
    p.fill("#seq_len", "1024")
    p.fill("#batch_tokens", "262144")
    p.fill("#deadline_days", "1")
    page.screenshot("study-form")
    p.click("#create-study")
    # The form lands on the study's page at once; the page follows the job and shows the result.
    p.wait_for_url(re.compile(r".*/studies/\d+$"))
    study_id = int(p.url.rsplit("/", 1)[1])
    p.wait_for_selector("#study-picks", timeout=60_000)
    study = httpx.get(f"{live_server.url}/api/v1/studies/{study_id}").json()
    fitting = [point for point in study["points"] if point["fits"]]
    assert study["name"] == "gpt2 on H100 or A100" and len(fitting) == 6

    # One point per cluster that fits, coloured per GPU type; the front drawn as a line.
    assert chart_marks(p, "study", "circle", "cluster") == len(fitting)
    assert chart_marks(p, "study", "path", "pareto") == (1 if sum(pt["pareto"] for pt in fitting) > 1 else 0)
    page.screenshot("study")
    # Readable: the front lies between the outermost labelled ticks (its costs, $20.7M-$22.5M here, were
    # once under a first tick of $25M), the axis titles clear their labels, the chart fills its card.
    inside, where = marks_inside_ticks(p, "study", "pareto")
    assert inside, where
    assert axis_title_overlaps(p, "study") == [] and width_share(p, "study") >= 0.97

    # Hover names the cluster and its configuration, as the table does.
    label = hover_text(p, "study", "cluster", index=0)
    first = next(pt for pt in fitting if pt["gpu"] == "H100-SXM-80GB")
    assert first["cluster"] in label and first["config_label"] in label, label

    # A click on the point opens that cluster's plan.
    centre = p.evaluate(MARKER_CENTRE, {"id": "plot-study", "css": "cluster", "index": 0})
    p.mouse.click(centre["x"], centre["y"])
    p.wait_for_url(f"**/plans/{first['plan_id']}")
    cluster = f"on {first['num_nodes']} × {first['gpus_per_node']} × H100-SXM-80GB"
    assert cluster in p.locator(".subtitle").inner_text()
    assert p.locator("#plan-studies").inner_text().startswith("A cluster of study")

    # Without JavaScript the study page is whole: the tables carry every number.
    context = p.context.browser.new_context(java_script_enabled=False)
    try:
        plain = context.new_page()
        plain.goto(f"{live_server.url}/studies/{study_id}")
        assert plain.locator("#study-points tbody tr").count() == len(fitting)
        assert plain.locator("#study-refused tbody tr").count() == len(study["points"]) - len(fitting)
        assert plain.locator("figure[data-chart=study] noscript").count() == 1
        assert plain.locator("#data-study tbody tr").count() >= len(fitting)
    finally:
        context.close()


LARGE_STUDY = {
    "model": "llama3-8b", "token_budget": 10**12, "gpus": [{"gpu": "H100"}],
    "cluster_sizes": {"min_gpus": 16, "max_gpus": 2048, "progression": "step", "step": 16},
    "seq_len": 8192, "global_batch_tokens": 4 * 1024 * 1024,
}


def test_a_running_study_shows_a_live_progress_bar_and_cancels(
    live_server: LiveServer, page: BrowserPage
) -> None:
    p = page.page
    created = httpx.post(f"{live_server.url}/api/v1/studies", json=LARGE_STUDY, timeout=30)
    assert created.status_code == 202, created.text
    study_id = created.json()["id"]
    p.goto(f"{live_server.url}/studies/{study_id}")
    bar = p.locator("#study-progress")
    assert bar.is_visible() and bar.get_attribute("max") == "128"
    # The page polls the API: the bar moves without a reload (the page's CSP rules out wait_for_function).
    deadline = time.monotonic() + 60
    while int(bar.get_attribute("value") or 0) < 2:
        assert time.monotonic() < deadline, bar.get_attribute("value")
        p.wait_for_timeout(200)
    assert "clusters searched" in p.locator("#study-progress-text").inner_text()
    page.screenshot("study-running")
    p.click("#cancel-study button")
    p.wait_for_selector("#study-cancelled")
    assert httpx.get(f"{live_server.url}/api/v1/studies/{study_id}").json()["state"] == "cancelled"
