"""A pipeline plan in a real browser: planned through the API with search.pipeline_parallel_degrees, its
page draws the schedule's SVG under the dashboard's content security policy (the page fixture fails on
any console error), every action box visible, a box's tooltip naming what it is."""

from __future__ import annotations

import httpx
import pytest

from tests.dashboard.conftest import BrowserPage, LiveServer

pytestmark = pytest.mark.browser


def test_a_pipeline_plan_draws_its_schedule(live_server: LiveServer, page: BrowserPage) -> None:
    body = {"model": "llama-debug", "cluster": "1x4xcpu",
            "training": {"seq_len": 128, "global_batch_tokens": 2048},
            "search": {"pipeline_parallel_degrees": [2], "pipeline_schedules": ["1F1B"],
                       "tensor_parallel_degrees": [1]}}
    response = httpx.post(f"{live_server.url}/api/v1/plans", json=body, timeout=180)
    assert response.status_code == 201, response.text
    plan = response.json()["plan"]
    micro_batches = plan["config"]["grad_accum_steps"]

    p = page.page
    p.goto(f"{live_server.url}/plans/{response.json()['id']}")
    figure = p.locator("#pipeline-timeline > svg")
    assert figure.is_visible() and figure.bounding_box()["width"] > 600  # type: ignore[index]
    boxes = p.locator("#pipeline-timeline g.pp-action rect")
    assert boxes.count() == 2 * 2 * micro_batches
    assert all(b.bounding_box()["width"] > 1 for b in boxes.all())  # type: ignore[index]
    assert p.locator("#pipeline-timeline g.pp-action[data-kind='backward'] title").first.text_content() \
        .startswith("rank 0, stage 0: backward of micro-batch 0, ")  # in rank order: rank 0's first
    assert p.locator("#stages-table tbody tr").count() == 2
    page.screenshot("pipeline-plan")
