"""A GB200 NVL72 rack planned through the new-plan form in a real browser: its GPUs per NVLink domain
typed beside the GPU, a tensor-parallel degree pinned, the plan page naming the domain."""

from __future__ import annotations

import re

import pytest

from tests.dashboard.conftest import BrowserPage, LiveServer
from tests.dashboard.test_browser import fill_plan_form

pytestmark = pytest.mark.browser


def test_a_rack_is_planned_with_its_domain_from_the_form(live_server: LiveServer, page: BrowserPage) -> None:
    p = page.page
    page.expected_statuses.add(422)
    p.goto(live_server.url + "/plans/new")
    assert "72 for GB200 and GB300" in p.locator("#domain-help").inner_text()
    fill_plan_form(p, model="llama2-7b", nodes="16", gpus="4", gpu="GB200", seq_len="2048", batch="4194304",
                   name="Rack tp16")
    p.fill("#tensor_parallel_degree", "16")
    p.fill("#scaleup_domain_gpus", "60")  # 15 nodes of 4, which tp 16 does not tile
    p.click("#create-plan")
    error = p.locator("#error-tensor_parallel_degree")
    error.wait_for()
    assert "describe domains of 48 GPUs" in error.inner_text()
    assert p.locator("#scaleup_domain_gpus").input_value() == "60"  # what was typed comes back
    p.fill("#scaleup_domain_gpus", "64")
    p.click("#create-plan")
    p.wait_for_url(re.compile(r".*/plans/\d+$"))
    assert "16 × 4 × GB200 in scale-up domains of 64" in p.locator("body").inner_text()
    page.screenshot("rack-plan")
