"""The guide at /docs/guide in a real Chromium, from a real `fsdp-planner serve`: its pages run under the
server's Content-Security-Policy with nothing refused, and its search (scripts and index served by the
server itself) finds pages, with no internet."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.dashboard.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.live_server import running_server

pytestmark = pytest.mark.browser


def test_the_guide_runs_and_searches_in_a_browser(built_site: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    env = {**os.environ, "FSDP_PLANNER_DATA_DIR": str(tmp_path),
           "FSDP_PLANNER_DOCS_SITE_DIR": str(built_site)}
    server = running_server(env=env, log=tmp_path / "server.log")
    with server as url, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        problems: list[str] = []
        page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on("requestfailed", lambda request: problems.append(f"failed: {request.url}"))
        page.goto(f"{url}/docs/guide/planning/tensor-parallel/")
        assert page.locator("h1").first.inner_text().startswith("Tensor parallelism")
        page.locator("input.md-search__input").click()
        page.locator("input.md-search__input").press_sequentially("calibrate", delay=20)
        page.locator(".md-search-result__item").first.wait_for(timeout=30_000)
        assert page.locator(".md-search-result__item").count() >= 1
        browser.close()
    assert problems == []
