"""A 2-D (tensor x data parallel) plan in a real browser: pinned through the form, its mesh on the
plan page, found through the list's tp and sharding filters, compared with a data-parallel plan.

Its own server (the module's live_server), so the list holds exactly the plans made here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.dashboard.conftest import BrowserPage, LiveServer
from tests.dashboard.test_browser import fill_plan_form, listed_names

pytestmark = pytest.mark.browser


def create_debug_plan(page: Any, url: str, *, name: str, tensor_parallel: str) -> int:
    """llama-debug on four CPU ranks through the new-plan form; the plan's id."""
    page.goto(url + "/plans/new")
    fill_plan_form(page, model="llama-debug", nodes="1", gpus="4", gpu="cpu", seq_len="128", batch="2048",
                   name=name)
    page.fill("#tensor_parallel_degree", tensor_parallel)
    page.click("#create-plan")
    page.wait_for_url(re.compile(r".*/plans/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def test_a_2d_plan_shows_its_mesh_and_the_list_filters_by_tp(
    live_server: LiveServer, page: BrowserPage
) -> None:
    p = page.page
    pinned = create_debug_plan(p, live_server.url, name="Debug tp2", tensor_parallel="2")
    plan = p.request.get(f"{live_server.url}/api/v1/plans/{pinned}").json()["plan"]
    assert plan["config"]["mesh"]["tp"] == 2

    # The plan page: the mesh in the chosen configuration, the tensor-parallel time in the predictions.
    config = p.locator("#config-title + dl").inner_text()
    assert "dp_replicate 1 × dp_shard 2 × tp 2" in config and "sequence parallel" in config
    predictions = p.locator("#prediction-title + dl").inner_text()
    assert "Tensor-parallel communication" in predictions
    assert " tp2 " in p.locator(".subtitle").inner_text()
    assert p.locator("#timeline-tensor-parallel").is_visible()
    page.screenshot("plan-detail-tensor-parallel")

    # Unpinned, the same inputs plan data parallelism and say why tp=2 and tp=4 lost.
    free = create_debug_plan(p, live_server.url, name="Debug free", tensor_parallel="")
    rejected = p.locator("#rejected-table tbody").inner_text()
    assert " tp2 " in rejected and " tp4 " in rejected  # rows labelled with their whole mesh
    assert "tp 1" in p.locator("#config-title + dl").inner_text()

    # The list: a Mesh column, and the tp filter finds the 2-D plan only.
    page.follow("nav >> text=Plans")
    assert listed_names(p) == ["Debug free", "Debug tp2"]
    meshes = [m.strip() for m in p.locator("#plans-table tbody .cell-mesh").all_inner_texts()]
    assert meshes[0].endswith(" dp4x1 tp1") and meshes[1].endswith(" dp2x1 tp2"), meshes
    p.select_option("#filter-tp", "2")
    p.click("#apply-filters")
    p.wait_for_url(re.compile(r".*tp=2.*"))
    assert listed_names(p) == ["Debug tp2"]
    assert p.locator("#filter-tp").input_value() == "2"
    page.screenshot("plans-filtered-by-tp")
    p.select_option("#filter-tp", "1")
    p.click("#apply-filters")
    p.wait_for_url(re.compile(r".*tp=1.*"))
    assert listed_names(p) == ["Debug free"]
    # With a sharding the tp=1 plan does not use, nothing matches.
    other = next(s for s in ("full_shard", "shard_grad_op", "no_shard")
                 if s != p.request.get(f"{live_server.url}/api/v1/plans/{free}").json()["plan"]["config"]
                 ["sharding"])
    p.select_option("#filter-sharding", other)
    p.click("#apply-filters")
    p.wait_for_url(re.compile(rf".*sharding={other}.*"))
    assert p.locator("#no-matches").is_visible()
    page.follow("#clear-filters")
    assert listed_names(p) == ["Debug free", "Debug tp2"]

    # Compared, the tensor-parallel row differs.
    p.check(f'input[name="ids"][value="{pinned}"]')
    p.check(f'input[name="ids"][value="{free}"]')
    p.click("#compare-button")
    p.wait_for_url(re.compile(r".*/compare\?ids=.*"))
    row = p.locator("#compare-table tr", has=p.locator('th:text-is("Tensor parallel (GPUs)")'))
    assert row.get_attribute("class") == "differs"
    assert "2 (sequence + loss parallel)" in row.inner_text() and "none (1)" in row.inner_text()
    page.screenshot("compare-tensor-parallel")
