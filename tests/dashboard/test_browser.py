"""The dashboard in a real browser (headless Debian Chromium) against a real server process.

One server per module: the tests run in file order and build on each other's plans, as a person would
(create through the form, find in the list, sort, filter, open, download, compare). Every page visited
must log no console error; each one leaves a screenshot in test-artifacts/screenshots/.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.db.models import PlanRow
from contract.plan_document import SCHEMA_VERSION
from tests.dashboard.conftest import BrowserPage, LiveServer
from tests.dashboard.layout import axis_title_overlaps, width_share, wrapped_lines
from tests.dashboard.sample_data import h100_profile, insert_calibration, insert_runs

pytestmark = pytest.mark.browser



def chart_marks(page: Any, chart: str, kind: str, css_class: str | None = None) -> int:
    """What plotly.js drew in one chart, read from the page: `circle` markers, `path` lines, `rect`
    bars or vertical `errorbar`s, optionally of the traces whose `meta.class` has `css_class` (guides
    left out). Also checks that the chart is plotted and laid out (a real size, not a collapsed box)."""
    return int(page.evaluate(DRAWN_MARKS, drawn_figure(page, chart) | {"kind": kind, "css": css_class}))


def drawn_figure(page: Any, chart: str) -> dict[str, str]:
    figure = page.locator(f'figure[data-chart="{chart}"]')
    page.wait_for_selector(f'figure[data-chart="{chart}"].plotted', state="attached")
    box = figure.locator(".main-svg").first.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 80, f"{chart} chart is not laid out: {box}"
    return {"id": f"plot-{chart}"}


DRAWN_MARKS = """({id, kind, css}) => {
  const plot = document.getElementById(id);
  const layer = kind === "rect" ? ".barlayer" : ".scatterlayer";
  const marks = {
    circle: "path.point", path: "path.js-line", rect: "g.point path", errorbar: "path.yerror",
  }[kind];
  let count = 0;
  plot.querySelectorAll(layer + " g.trace").forEach((group) => {
    const trace = group.__data__ && group.__data__[0] && group.__data__[0].trace;
    const classes = ((trace && trace.meta && trace.meta.class) || "").split(" ");
    if (classes.includes("guide") || (css && !classes.includes(css))) return;
    group.querySelectorAll(marks).forEach((mark) => {
      const box = mark.getBBox();
      if (box.width > 0 || box.height > 0) count += 1;
    });
  });
  return count;
}"""


def hover_text(page: Any, chart: str, css_class: str, index: int = 0) -> str:
    """Move the mouse onto a marker of the traces with `css_class` (plotly.js listens on its drag layer,
    above the marks) and return the hover label it shows."""
    page.locator(f'figure[data-chart="{chart}"]').scroll_into_view_if_needed()
    centre = page.evaluate(MARKER_CENTRE, {"id": f"plot-{chart}", "css": css_class, "index": index})
    assert centre, f"no {css_class} marker in the {chart} chart"
    page.mouse.move(centre["x"], centre["y"])
    label = page.locator(f'figure[data-chart="{chart}"] .hoverlayer .hovertext')
    label.first.wait_for(state="visible")
    return label.first.text_content() or ""


MARKER_CENTRE = """({id, css, index}) => {
  const plot = document.getElementById(id);
  const markers = [];
  plot.querySelectorAll(".scatterlayer g.trace").forEach((group) => {
    const trace = group.__data__ && group.__data__[0] && group.__data__[0].trace;
    const classes = ((trace && trace.meta && trace.meta.class) || "").split(" ");
    if (classes.includes(css)) group.querySelectorAll("path.point").forEach((m) => markers.push(m));
  });
  const marker = markers[index];
  if (!marker) return null;
  const box = marker.getBoundingClientRect();
  return {x: box.left + box.width / 2, y: box.top + box.height / 2};
}"""


def fill_plan_form(page: Any, *, model: str, nodes: str, gpus: str, gpu: str, seq_len: str, batch: str,
                   name: str) -> None:
    page.select_option("#model", model)
    page.fill("#num_nodes", nodes)
    page.fill("#gpus_per_node", gpus)
    page.select_option("#gpu", gpu)
    page.fill("#seq_len", seq_len)
    page.fill("#global_batch_tokens", batch)
    page.fill("#name", name)


def listed_names(page: Any) -> list[str]:
    return [name.strip() for name in page.locator("#plans-table tbody .plan-link").all_inner_texts()]


def percents(page: Any, cell: str) -> list[float]:
    texts = page.locator(f"#plans-table tbody {cell}").all_inner_texts()
    return [float(text.strip().rstrip("%")) for text in texts]


def test_create_find_sort_filter_open_and_compare(live_server: LiveServer, page: BrowserPage) -> None:
    p = page.page
    p.goto(live_server.url + "/")
    assert p.title() == "Plans · fsdp-planner"
    assert p.locator("#empty-plans").is_visible()
    assert "api/v1/plans" in p.locator("#empty-plans pre").inner_text()
    page.screenshot("plans-empty")

    # Create two plans through the form, as a person would: from the nav, then submit.
    page.follow("text=New plan >> nth=0")
    assert p.title() == "New plan · fsdp-planner"
    fill_plan_form(p, model="gpt2", nodes="1", gpus="8", gpu="H100-SXM-80GB", seq_len="512", batch="4096",
                   name="GPT-2 baseline")
    assert p.locator("#batch-sequences").inner_text() == "= 8 sequences per step."
    page.screenshot("new-plan")
    p.click("#create-plan")
    p.wait_for_url(re.compile(r".*/plans/\d+$"))
    gpt2_id = int(p.url.rsplit("/", 1)[1])
    assert p.locator("#plan-name").inner_text() == "GPT-2 baseline"

    p.goto(live_server.url + "/plans/new")
    fill_plan_form(p, model="llama-debug", nodes="1", gpus="2", gpu="cpu", seq_len="512", batch="4096",
                   name="Debug on CPU")
    p.click("#create-plan")
    p.wait_for_url(re.compile(r".*/plans/\d+$"))
    debug_id = int(p.url.rsplit("/", 1)[1])

    # Find them in the list, newest first.
    page.follow("nav >> text=Plans")
    assert listed_names(p) == ["Debug on CPU", "GPT-2 baseline"]
    assert p.locator("#plan-count").inner_text().startswith("2 plans")
    page.screenshot("plans")

    # Sort by MFU through the header link, both ways; then by model.
    p.click('a.sort-link[data-sort="mfu"]')
    p.wait_for_url(re.compile(r".*sort=mfu.*"))
    descending = percents(p, ".cell-mfu")
    assert descending == sorted(descending, reverse=True) and len(descending) == 2
    assert p.locator('th[aria-sort="descending"]').inner_text().startswith("MFU")
    p.click('a.sort-link[data-sort="mfu"]')
    p.wait_for_url(re.compile(r".*order=asc.*"))
    assert percents(p, ".cell-mfu") == sorted(descending)
    p.click('a.sort-link[data-sort="model"]')
    p.wait_for_url(re.compile(r".*sort=model.*"))
    models = [m.strip() for m in p.locator("#plans-table tbody .cell-model").all_inner_texts()]
    assert models == ["gpt2", "llama-debug"]
    page.screenshot("plans-sorted-by-model")

    # Filter by GPU, then by name; the sort is kept; clearing brings both back.
    p.select_option("#filter-gpu", "cpu")
    p.click("#apply-filters")
    p.wait_for_url(re.compile(r".*gpu=cpu.*"))
    assert listed_names(p) == ["Debug on CPU"] and "sort=model" in p.url
    p.select_option("#filter-gpu", "")
    p.fill("#filter-q", "baseline")
    p.click("#apply-filters")
    p.wait_for_url(re.compile(r".*q=baseline.*"))
    assert listed_names(p) == ["GPT-2 baseline"]
    page.screenshot("plans-filtered")
    page.follow("#clear-filters")
    assert listed_names(p) == ["GPT-2 baseline", "Debug on CPU"]

    # Open a plan from the list: every chart drew real marks.
    p.click("text=GPT-2 baseline")
    p.wait_for_url(f"**/plans/{gpt2_id}")
    assert p.title() == f"GPT-2 baseline · plan {gpt2_id} · fsdp-planner"
    assert chart_marks(p, "memory", "rect") >= 6
    # One mark per timeline segment at least (a partly exposed transfer draws two).
    stored = p.request.get(f"{live_server.url}/api/v1/plans/{gpt2_id}").json()
    assert chart_marks(p, "timeline", "rect") >= len(stored["plan"]["prediction"]["timeline"]) > 10
    assert chart_marks(p, "timeline", "rect", "exposed") >= 1  # exposed communication is marked
    assert chart_marks(p, "tradeoff", "circle") > 3
    assert chart_marks(p, "tradeoff", "circle", "chosen") == 1
    assert chart_marks(p, "tradeoff", "path", "pareto") == 1
    # Hovering the chosen plan's point names its configuration.
    assert stored["plan"]["config"]["sharding"] in hover_text(p, "tradeoff", "chosen")
    assert p.locator("#alternatives-table tbody tr").count() >= 2
    assert p.locator("#rejected-table tbody tr").count() >= 1
    assert p.locator("#no-runs").is_visible()
    # Every number shown carries its 80% interval: under the headline numbers, in the alternatives'
    # rows, and as error bars on the trade-off chart (one per alternative at least, and the pick's).
    interval = stored["plan"]["prediction"]["tokens_per_s_per_gpu_interval"]
    assert p.locator("#metric-throughput-interval").inner_text() == (
        f"80%: {interval['low']:,.0f}–{interval['high']:,.0f}")
    assert p.locator("#metric-memory-interval").is_visible() and p.locator("#interval-note").is_visible()
    assert p.locator("#alternatives-table tbody .interval").count() >= 4
    assert chart_marks(p, "tradeoff", "errorbar", "chosen") == 1
    assert chart_marks(p, "tradeoff", "errorbar", "alternative") >= 1
    page.screenshot("plan-detail")

    # Download the raw plan JSON.
    with p.expect_download() as download_info:
        p.click("#download-plan-json")
    download = download_info.value
    assert download.suggested_filename == f"plan-{gpt2_id}.json"
    document = json.loads(Path(download.path()).read_text())
    assert document["id"] == gpt2_id and document["plan"]["schema_version"] == SCHEMA_VERSION
    assert document["plan"]["config"]["sharding"] in p.locator("#config-title + dl").inner_text()

    # Compare both: tick them in the list, press Compare.
    p.goto(live_server.url + "/")
    assert p.locator("#compare-button").is_disabled()
    p.check(f'input[name="ids"][value="{gpt2_id}"]')
    p.check(f'input[name="ids"][value="{debug_id}"]')
    assert p.locator("#compare-button").inner_text() == "Compare 2 plans"
    p.click("#compare-button")
    p.wait_for_url(re.compile(r".*/compare\?ids=.*"))
    assert p.locator("#compare-table thead th").count() == 3
    assert p.locator("#compare-table tr.differs").count() > 5
    assert p.locator("#compare-table td.best").count() > 3
    assert chart_marks(p, "compare-memory", "rect") >= 10
    page.screenshot("compare")
    p.check("#only-differences")
    assert p.locator("#compare-table tr.same").first.is_hidden()
    assert p.locator("#compare-table tr.differs").first.is_visible()


def test_form_validation_errors_appear_beside_the_field(live_server: LiveServer, page: BrowserPage) -> None:
    p = page.page
    page.expected_statuses.add(422)
    p.goto(live_server.url + "/plans/new")
    fill_plan_form(p, model="gpt2", nodes="1", gpus="8", gpu="H100-SXM-80GB", seq_len="512", batch="4000",
                   name="typo in the batch")
    # At once the arithmetic ("Not a multiple of 512."), then the planner's own advice (POST
    # /plans/new/batch-hint): the batches a submission would name.
    at_once = p.locator("#batch-sequences").inner_text()
    assert re.search(r"Not a multiple of 512|not a whole number of 512", at_once)
    # A locator wait, not wait_for_function: the page's CSP refuses the eval that one needs.
    p.locator("#batch-sequences", has_text="e.g. 8 sequences").wait_for()
    hint = p.locator("#batch-sequences").inner_text()
    assert "8 sequences = 4096 tokens" in hint
    p.click("#create-plan")
    error = p.locator("#error-global_batch_tokens")
    error.wait_for()
    assert "whole number of 512-token sequences" in error.inner_text()
    assert hint in error.inner_text()  # the hint and the refusal name the same batches
    field = p.locator(".field", has=p.locator("#global_batch_tokens"))
    assert field.locator("#error-global_batch_tokens").is_visible()  # beside its own input
    assert p.locator("#global_batch_tokens").get_attribute("aria-invalid") == "true"
    assert p.locator("#seq_len").input_value() == "512"  # what was typed comes back
    assert p.locator("#name").input_value() == "typo in the batch"
    assert p.locator(".field-error").count() == 1
    page.screenshot("new-plan-errors")

    # A pasted config that is not JSON: the error sits under the textarea, which stays visible.
    p.check("#source-config")
    assert p.locator("#model").is_hidden() and p.locator("#model_config").is_visible()
    p.fill("#model_config", '{"architectures": ["LlamaForCausalLM"],')
    p.fill("#global_batch_tokens", "4096")
    p.click("#create-plan")
    p.locator("#error-model_config").wait_for()
    assert "not valid JSON" in p.locator("#error-model_config").inner_text()
    assert p.locator(".field", has=p.locator("#model_config")).locator("#error-model_config").is_visible()


def test_launcher_archive_download(live_server: LiveServer, page: BrowserPage) -> None:
    training = {"seq_len": 256, "global_batch_tokens": 2048}
    body = {"model": "llama-debug", "cluster": "1x2xcpu", "training": training}
    created = httpx.post(live_server.url + "/api/v1/plans", json=body)
    assert created.status_code in (200, 201), created.text
    plan_id = created.json()["id"]
    p = page.page
    p.goto(f"{live_server.url}/plans/{plan_id}")
    with p.expect_download() as download_info:
        p.click("#download-launcher-torchrun")
    data = Path(download_info.value.path()).read_bytes()
    if zipfile.is_zipfile(io.BytesIO(data)):
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    else:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            names = archive.getnames()
    assert any(name.endswith("launch.sh") for name in names), names
    assert any(name.endswith("plan.json") for name in names), names


def test_missing_plan_shows_an_html_error_page(live_server: LiveServer, page: BrowserPage) -> None:
    page.expected_statuses.add(404)
    p = page.page
    response = p.goto(live_server.url + "/plans/424242")
    assert response is not None and response.status == 404
    assert p.title() == "404 Not Found · fsdp-planner"
    assert "Plan 424242 does not exist" in p.locator("main").inner_text()
    page.screenshot("not-found")


def test_calibrations_and_accuracy_pages(live_server: LiveServer, page: BrowserPage) -> None:
    p = page.page
    p.goto(live_server.url + "/calibrations")
    assert p.locator("#empty-calibrations").is_visible()
    page.screenshot("calibrations-empty")
    p.goto(live_server.url + "/accuracy")
    assert p.locator("#empty-accuracy").is_visible()
    page.screenshot("accuracy-empty")

    # What the calibration and validation uploads would have stored.
    with live_server.db.session() as session:
        calibration = insert_calibration(session, h100_profile())
        plans = session.query(PlanRow).all()
        for seed, plan in enumerate(plans):
            insert_runs(session, plan, 4, seed=seed)
    runs = 4 * len(plans)

    p.goto(live_server.url + "/calibrations")
    p.click("text=8x H100 node a17")
    p.wait_for_url(f"**/calibrations/{calibration.id}")
    assert chart_marks(p, "matmul", "circle") == 12
    assert chart_marks(p, "matmul", "path") == 2
    assert chart_marks(p, "collective", "circle") == 33
    assert "NVIDIA H100 80GB HBM3" in p.locator("#hardware-title + dl").inner_text()
    page.screenshot("calibration-detail")

    page.follow("nav >> text=Accuracy")
    assert p.title() == "Accuracy · fsdp-planner"
    assert chart_marks(p, "step-time", "circle") == runs
    assert chart_marks(p, "memory-accuracy", "circle") == runs
    assert chart_marks(p, "errors", "rect") >= 2
    assert p.locator("#accuracy-summary tbody tr").count() == 3
    page.screenshot("accuracy")


def test_charts_and_tables_are_readable_at_1280_px(live_server: LiveServer, page_factory: Any) -> None:
    """On a 1280 px laptop screen: charts as wide as their cards, axis titles clear of the tick labels,
    the calibration's parameter labels on one or two lines (issue 24, item 7)."""
    laptop = page_factory(viewport={"width": 1280, "height": 900})
    p = laptop.page
    calibration_id = httpx.get(live_server.url + "/api/v1/calibrations").json()["items"][0]["id"]
    plan_id = httpx.get(live_server.url + "/api/v1/plans").json()["items"][0]["id"]
    pages = {
        f"/calibrations/{calibration_id}": ("matmul", "collective"),
        "/accuracy": ("step-time", "memory-accuracy", "errors", "corpus-throughput"),
        f"/plans/{plan_id}": ("memory", "timeline", "tradeoff"),
    }
    for path, charts in pages.items():
        p.goto(live_server.url + path)
        for chart in charts:
            p.locator(f'figure[data-chart="{chart}"]').scroll_into_view_if_needed()
            assert axis_title_overlaps(p, chart) == [], (path, chart)
            assert width_share(p, chart) >= 0.97, (path, chart, width_share(p, chart))
        if path.startswith("/calibrations/"):
            labels = wrapped_lines(p, "#fitted-table tbody th, #hardware-title + dl dt")
            assert len(labels) > 20 and max(lines for _, lines in labels) <= 2, labels
            laptop.screenshot("calibration-detail-1280")
        elif path == "/accuracy":
            laptop.screenshot("accuracy-1280")


def test_pages_are_readable_on_a_phone(live_server: LiveServer, page_factory: Any) -> None:
    phone = page_factory(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                         device_scale_factor=2)
    p = phone.page
    plan_id = httpx.get(live_server.url + "/api/v1/plans").json()["items"][0]["id"]
    for name, path in (("plans", "/"), ("plan-detail", f"/plans/{plan_id}"), ("new-plan", "/plans/new"),
                       ("accuracy", "/accuracy")):
        p.goto(live_server.url + path)
        # Nothing wider than the screen except inside the scrolling chart and table boxes.
        assert p.evaluate("document.documentElement.scrollWidth") <= 390, path
        font = p.evaluate("parseFloat(getComputedStyle(document.body).fontSize)")
        assert font >= 14, path
        phone.screenshot(f"phone-{name}")
    p.goto(live_server.url + "/")
    # On a phone the plan list is a stack of cards, each value labelled.
    first_cell = p.locator("#plans-table tbody tr").first.locator(".cell-throughput")
    label = p.evaluate("(el) => getComputedStyle(el, '::before').content", first_cell.element_handle())
    assert label.startswith('"Tokens/s/GPU')


def test_api_docs_render_without_internet(live_server: LiveServer, page: BrowserPage) -> None:
    """/docs draws every operation with every request to another host refused (a cluster offline)."""
    p = page.page
    server_origin = live_server.url.rstrip("/")
    refused: list[str] = []

    def only_this_server(route: Any) -> None:
        url = route.request.url
        if url.startswith(server_origin + "/") or url.startswith("data:"):
            route.continue_()
        else:
            refused.append(url)
            route.abort("internetdisconnected")

    p.context.route("**/*", only_this_server)
    p.goto(live_server.url + "/docs")
    p.wait_for_selector(".opblock", timeout=20_000)
    assert p.locator(".information-container .title").inner_text().startswith("fsdp-planner")
    paths = {text.strip() for text in p.locator(".opblock-summary-path").all_inner_texts()}
    assert {"/api/v1/plans", "/api/v1/plans/{plan_id}", "/api/v1/calibrations"} <= {
        path.replace("\u200b", "") for path in paths
    }
    assert p.locator(".opblock").count() >= 15
    # Expanding one shows its parameters: the UI works, not just its first paint.
    p.locator(".opblock-get .opblock-summary-path", has_text="/api/v1/plans/").first.click()
    p.wait_for_selector(".opblock.is-open .parameters, .opblock.is-open .opblock-description-wrapper")
    page.screenshot("api-docs")
    assert refused == [], f"/docs asked other hosts for {refused}"


def test_a_405b_timeline_is_readable(live_server: LiveServer, page: BrowserPage) -> None:
    """Hundreds of units are drawn per phase: a few blocks, each wide enough to see and hover."""
    created = httpx.post(f"{live_server.url}/api/v1/plans", timeout=60, json={
        "model": "llama3.1-405b", "cluster": "128x8xH100", "name": "405B timeline",
        "training": {"seq_len": 2048, "global_batch_tokens": 2048 * 2048},
        "search": {"pipeline_parallel_degrees": [1]},  # one rank holds all 126 blocks
    })
    assert created.status_code == 201, created.text
    p = page.page
    p.goto(f"{live_server.url}/plans/{created.json()['id']}")
    assert 4 <= chart_marks(p, "timeline", "rect") <= 12
    blocks = p.locator("#plot-timeline .barlayer g.point path")
    widths = [box["width"] for box in (blocks.nth(i).bounding_box() for i in range(blocks.count())) if box]
    assert min(widths) >= 4, widths  # on screen: no one-pixel stripes
    assert p.locator("#plot-timeline .barlayer text.bartext", has_text="backward").count() >= 1
    p.locator('figure[data-chart="timeline"]').scroll_into_view_if_needed()
    page.screenshot("plan-405b-timeline")

    # 46 families lose for memory alone: one closed line that a click opens, no script needed.
    folded = p.locator("#rejected-oom")
    assert folded.get_attribute("open") is None and p.locator("#rejected-oom-table").is_hidden()
    line = folded.locator("summary").inner_text()
    assert re.match(r"out of memory \d+ more families do not fit: the closest, ", line), line
    folded.locator("summary").click()
    assert p.locator("#rejected-oom-table").is_visible()
    assert p.locator("#rejected-oom-table tbody tr").count() > 40
    page.screenshot("plan-405b-rejected")
