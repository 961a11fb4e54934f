"""Server-side tests of every dashboard page: status, key content, empty states, errors, escaping, auth."""

from __future__ import annotations

import base64
import html as html_module
import re
import shlex
import time
import tomllib
from pathlib import Path

import pytest
import typer
from fastapi.testclient import TestClient
from rich.console import Console

from api import keys
from api.app import create_app
from api.cli.calibrate_cmd import show_fit
from api.cli.main import app as cli_app
from api.db.models import PlanRow, ValidationRunRow
from api.db.session import create_db_engine, create_session_factory
from api.hints import CLI_ACTIVATE, EXECUTOR_EXTRA_INSTALL
from api.settings import Settings
from planner.calibration import CalibrationProfile
from tests.api.conftest import cpu_profile
from tests.dashboard.conftest import DEBUG_CPU_FORM, GPT2_FORM, REPO_ROOT, Database, create_plan
from tests.dashboard.figures import figure_html as figure
from tests.dashboard.figures import marks, plot, traces
from tests.dashboard.sample_data import h100_profile, insert_calibration, insert_runs

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def row_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-plan-id="(\d+)"', html)]


def error_beside(html: str, input_id: str, error_field: str) -> str:
    """The error text shown for `error_field`, asserting it sits in the same form field as `input_id`."""
    field = re.search(
        rf'<div class="field"[^>]*>(?:(?!<div class="field").)*?id="{input_id}"(?:(?!<div class="field").)*?'
        rf'<p class="field-error" id="error-{error_field}"[^>]*>(.*?)</p>', html, re.S,
    )
    assert field, f"no error for {error_field} beside #{input_id}"
    return html_module.unescape(" ".join(field.group(1).split()))


def test_empty_states_say_what_to_do(client: TestClient) -> None:
    plans = client.get("/", headers=HTML)
    assert plans.status_code == 200
    assert "<title>Plans · fsdp-planner</title>" in plans.text
    assert 'id="empty-plans"' in plans.text
    assert 'href="/plans/new"' in plans.text
    assert "curl -s http://testserver/api/v1/plans" in plans.text  # a runnable example for this server

    calibrations = client.get("/calibrations")
    assert calibrations.status_code == 200 and 'id="empty-calibrations"' in calibrations.text
    assert "fsdp-planner calibrate" in calibrations.text
    assert "--upload http://testserver/" in calibrations.text

    accuracy = client.get("/accuracy")
    assert accuracy.status_code == 200 and 'id="empty-accuracy"' in accuracy.text
    assert "fsdp-planner validate" in accuracy.text

    compare = client.get("/compare")
    assert compare.status_code == 200 and 'id="compare-empty"' in compare.text


def test_empty_states_give_commands_that_work_in_a_checkout(client: TestClient) -> None:
    # No package index has fsdp-planner: `pip install 'fsdp-planner[executor]'` failed for everyone.
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "executor" in extras and EXECUTOR_EXTRA_INSTALL == ".venv/bin/pip install '.[executor]'"
    cli = typer.main.get_command(cli_app)
    for path in ("/", "/calibrations", "/accuracy", "/studies"):
        page = client.get(path, headers=HTML).text
        (empty,) = re.findall(r'<section class="empty-state".*?</section>', page, re.S)
        assert "fsdp-planner[" not in page, path
        codes = [html_module.unescape(c) for c in re.findall(r"<code>(.*?)</code>", empty, re.S)]
        commands = [c for c in codes if c.startswith("fsdp-planner ")]
        assert commands and CLI_ACTIVATE in codes, (path, codes)  # where the command comes from
        for command in commands:
            argv = shlex.split(command.replace("\\\n", " "))
            # Parsed as the CLI parses it (unknown options and bad values fail), without running it.
            parent = cli.make_context("fsdp-planner", argv[1:])
            cli.get_command(parent, argv[1]).make_context(argv[1], argv[2:], parent=parent)
        if path in ("/calibrations", "/accuracy"):  # commands that run torch name the extra
            assert EXECUTOR_EXTRA_INSTALL in codes, path


def test_every_page_is_a_responsive_html_page_with_nav(client: TestClient) -> None:
    plan_id = create_plan(client)
    for path in ("/", "/plans/new", f"/plans/{plan_id}", "/calibrations", "/accuracy", "/compare"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in response.text
        assert re.search(r"<title>[^<]+ · fsdp-planner</title>", response.text)
        for link in ('href="/"', 'href="/plans/new"', 'href="/calibrations"', 'href="/accuracy"'):
            assert link in response.text, (path, link)
        assert "script-src 'self'" in response.headers["content-security-policy"]
    css = client.get("/static/dashboard.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert client.get("/static/dashboard.js").status_code == 200


def test_plan_created_through_the_form_opens_with_all_charts(client: TestClient) -> None:
    plan_id = create_plan(client, name="GPT-2 baseline")
    page = client.get(f"/plans/{plan_id}")
    assert page.status_code == 200
    html = page.text
    assert '<h1 id="plan-name">GPT-2 baseline</h1>' in html
    stored = client.get(f"/api/v1/plans/{plan_id}").json()
    plan = stored["plan"]
    # Inputs, chosen configuration and predictions.
    assert "gpt2" in html and "1 × 8 × H100-SXM-80GB" in html
    assert plan["config"]["sharding"] in html
    assert f"{plan['prediction']['tokens_per_s_per_gpu']:,.0f}" in html
    # Every chart has data marks: the memory parts, a timeline with exposed waits, the chosen plan once.
    breakdown = plan["prediction"]["memory_breakdown_gib"]
    assert marks(html, "memory", "rect") == sum(
        value > 0 for key, value in breakdown.items() if key != "moment"
    )
    assert "GPU capacity 79.6 GiB" in figure(html, "memory")
    assert marks(html, "timeline", "rect") >= len(plan["prediction"]["timeline"]) // 2
    assert marks(html, "timeline", "rect", "exposed") == sum(
        1 for seg in plan["prediction"]["timeline"] if seg["exposed_s"] > 0
    )
    assert marks(html, "tradeoff", "circle", "chosen") == 1
    assert marks(html, "tradeoff", "circle", "alternative") == len(plan["alternatives"])
    # A point per configuration on the Pareto front, and the line through them.
    assert marks(html, "tradeoff", "circle", "pareto") == len(plan["pareto_front"])
    assert marks(html, "tradeoff", "path") == 1
    # Without JavaScript, the chart's numbers are a table under it.
    assert '<details class="chart-data" id="data-memory">' in figure(html, "memory")
    assert len(traces(plot(html, "tradeoff"), "chosen")[0]["hovertext"]) == 1
    # Alternatives, why other families lost, downloads, validation runs' empty state.
    for alternative in plan["alternatives"]:
        assert alternative["label"] in html
    for rejected in plan["rejected"]:
        assert rejected["reason"] in html
    assert f'href="/api/v1/plans/{plan_id}" download="plan-{plan_id}.json"' in html
    assert 'id="no-runs"' in html and f"fsdp-planner validate --plan-id {plan_id}" in html


def test_out_of_memory_families_fold_into_one_line_that_opens(client: TestClient) -> None:
    """Llama 3 70B on 4 nodes loses two dozen families for memory: the page lists the families that
    fit and lost, then one closed <details> line for the rest; the API still returns every one."""
    created = client.post("/api/v1/plans", json={
        "model": "llama3-70b", "cluster": "4x8xH100",
        "training": {"seq_len": 8192, "global_batch_tokens": 8192 * 128},
    })
    assert created.status_code == 201, created.text
    rejected = created.json()["plan"]["rejected"]
    oom = [r for r in rejected if r["kind"] == "oom"]
    html = client.get(f"/plans/{created.json()['id']}").text
    listed = re.search(r'<table class="data cards" id="rejected-table">(.*?)</table>', html, re.S)
    assert listed and listed[1].count("<tr>") == len(rejected) - len(oom) + 1  # + the header row
    assert "badge-oom" not in listed[1]
    folded = re.search(
        r'<details class="folded" id="rejected-oom">\s*<summary>(.*?)</summary>(.*?)</details>', html, re.S
    )
    assert folded, "no folded out-of-memory line"
    closest = min(oom, key=lambda r: (r["min_peak_memory_gib"], r["family"]))
    assert f"{len(oom)} more families do not fit: the closest, {closest['family']}, needs" in folded[1]
    assert folded[2].count("<tr>") == len(oom) + 1
    for r in rejected:  # nothing lost: every family's reason is on the page
        assert html_module.escape(r["reason"], quote=False) in html


def test_identical_form_inputs_open_the_stored_plan(client: TestClient) -> None:
    first = create_plan(client)
    again = client.post("/plans/new", data=GPT2_FORM, follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"] == f"/plans/{first}?existing=1"
    assert 'id="existing-notice"' in client.get(again.headers["location"]).text
    assert len(client.get("/api/v1/plans").json()["items"]) == 1


@pytest.mark.parametrize(
    ("overrides", "input_id", "error_field", "expected"),
    [
        ({"global_batch_tokens": "4000"}, "global_batch_tokens", "global_batch_tokens",
         "whole number of 512-token"),
        ({"num_nodes": "two"}, "num_nodes", "num_nodes", "whole number"),
        ({"gpus_per_node": "3"}, "global_batch_tokens", "global_batch_tokens", "split evenly over 3 GPUs"),
        ({"num_nodes": "0"}, "num_nodes", "num_nodes", "greater than or equal to 1"),
        ({"gpu": "H999"}, "gpu", "gpu", "unknown GPU 'H999'"),
        ({"model": "llama3.1-405b"}, "cluster", "cluster", "does not fit"),
        ({"model": "nope"}, "model", "model", "unknown model 'nope'"),
        ({"model_source": "config", "model_config": "{not json"}, "model_config", "model_config",
         "not valid JSON"),
        ({"model_source": "config", "model_config": '{"architectures": ["BertModel"]}'}, "model_config",
         "model_config", "unsupported architecture BertModel"),
        ({"model_source": "config", "model_config": "[1, 2]"}, "model_config", "model_config", "JSON object"),
        ({"calibration_id": "999"}, "calibration_id", "calibration_id", "no such calibration profile"),
    ],
)
def test_form_errors_are_shown_beside_their_field(
    client: TestClient, overrides: dict[str, str], input_id: str, error_field: str, expected: str
) -> None:
    response = client.post("/plans/new", data={**GPT2_FORM, **overrides, "name": "kept as typed"})
    assert response.status_code == 422
    html = response.text
    if input_id == "cluster":  # a whole-cluster problem: shown at the top of the cluster fieldset
        assert re.search(r"<legend>Cluster</legend>\s*<p class=\"field-error\" id=\"error-cluster\"", html)
        assert expected in html
    else:
        assert expected in error_beside(html, input_id, error_field)
        assert re.search(rf'id="{input_id}"[^>]*aria-invalid="true"', html)
    assert 'id="form-problem"' in html
    assert 'value="kept as typed"' in html  # what was typed comes back
    assert client.get("/api/v1/plans").json()["items"] == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, "= 8 sequences per step."),
        ({"global_batch_tokens": "4000"}, "4000 is not a whole number of 512-token sequences (the batch must "
         "be a multiple of seq_len); use a batch that splits and fits on 1x8xH100-SXM-80GB, e.g. 8 sequences "
         "= 4096 tokens (split over 8 data-parallel ranks)"),
        ({"gpus_per_node": "3"}, "8 sequences of 512 tokens cannot be split evenly over 3 GPUs"),
        ({"gpu": "H999"}, ""),  # the GPU's own error shows on submit
        ({"calibration_id": "999", "gpus_per_node": "3"}, ""),  # and so does an unknown profile's
    ],
)
def test_the_batch_hint_is_the_planners_advice(
    client: TestClient, overrides: dict[str, str], expected: str
) -> None:
    hint = client.post("/plans/new/batch-hint", data={**GPT2_FORM, **overrides})
    assert hint.status_code == 200 and hint.headers["content-type"].startswith("text/plain")
    assert expected in hint.text and (expected or hint.text == "")


def test_the_batch_hint_and_a_refused_submission_name_the_same_batches(client: TestClient) -> None:
    # Issue 24, item 4: 100,000 tokens at seq 8192 on 8 GPUs; 12 sequences split over 4 ranks of tp=2.
    form = {"model": "llama3-8b", "num_nodes": "1", "gpus_per_node": "8", "gpu": "H100-SXM-80GB",
            "seq_len": "8192", "global_batch_tokens": "100,000"}
    hint = client.post("/plans/new/batch-hint", data=form).text
    assert "e.g. 12 sequences = 98304 tokens (split over 4 data-parallel ranks at tp=2)" in hint
    refused = client.post("/plans/new", data=form)
    assert refused.status_code == 422
    assert error_beside(refused.text, "global_batch_tokens", "global_batch_tokens") == hint


def test_pasted_hugging_face_config_is_planned(client: TestClient) -> None:
    config = """{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 32000,
      "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "_name_or_path": "tiny-llama"}"""
    plan_id = create_plan(client, model_source="config", model_config=config, model="gpt2")
    plan = client.get(f"/api/v1/plans/{plan_id}").json()
    assert plan["plan"]["model"]["architecture"] == "llama" and plan["plan"]["model"]["num_layers"] == 4


def test_missing_pages_are_html_for_browsers_and_problems_for_api_clients(client: TestClient) -> None:
    missing = client.get("/plans/999", headers=HTML)
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "Plan 999 does not exist" in missing.text
    assert "<title>404 Not Found · fsdp-planner</title>" in missing.text
    # No Accept preference (curl's */*): a dashboard page still answers in HTML.
    assert client.get("/plans/999").headers["content-type"].startswith("text/html")
    as_json = client.get("/plans/999", headers={"Accept": "application/json"})
    assert as_json.status_code == 404 and as_json.headers["content-type"] == "application/problem+json"
    assert "Plan 999 does not exist" in as_json.json()["detail"]
    for path in ("/plans/abc", "/plans/0", "/calibrations/7", "/calibrations/x", "/compare?ids=1,999"):
        response = client.get(path, headers=HTML)
        assert response.status_code == 404, path
        assert response.headers["content-type"].startswith("text/html"), path
    unknown = client.get("/no-such-page", headers=HTML)
    assert unknown.status_code == 404 and "There is no page at /no-such-page" in unknown.text
    # The API keeps its problem JSON, even for a browser.
    api = client.get("/api/v1/plans/999", headers=HTML)
    assert api.status_code == 404 and api.headers["content-type"] == "application/problem+json"
    assert client.get("/no-such-page").headers["content-type"] == "application/problem+json"


def test_user_text_is_escaped_everywhere(client: TestClient) -> None:
    hostile = "<script>alert(1)</script>"
    first = create_plan(client, name=hostile)
    second = create_plan(client, **DEBUG_CPU_FORM, name='"><img src=x onerror=alert(2)>')
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    pages = [client.get(path).text for path in ("/", f"/plans/{first}", f"/compare?ids={first},{second}")]
    for html in pages:
        assert hostile not in html and "<img src=x" not in html
    assert all(escaped in html for html in pages)
    # In the compare page's SVG too (bar labels and tooltips are text nodes, escaped by the chart code).
    assert "&lt;script&gt;" in figure(pages[2], "compare-memory")
    # A rejected form shows the hostile input back, escaped.
    rejected = client.post("/plans/new", data={**GPT2_FORM, "num_nodes": hostile})
    assert rejected.status_code == 422 and hostile not in rejected.text and escaped in rejected.text


def test_sorting_filtering_and_pages(client: TestClient) -> None:
    gpt2 = create_plan(client, name="gpt2 baseline")
    debug = create_plan(client, **DEBUG_CPU_FORM, name="debug on cpu")
    small = create_plan(client, gpus_per_node="4", name="gpt2 on four")
    summaries = {p["id"]: p for p in client.get("/api/v1/plans").json()["items"]}

    assert row_ids(client.get("/").text) == [small, debug, gpt2]  # newest first
    for sort, key in (("mfu", "mfu"), ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
                      ("peak_memory_gib", "peak_memory_gib"), ("world_size", "world_size")):
        for order in ("asc", "desc"):
            expected = sorted(summaries, key=lambda i: (summaries[i][key], i), reverse=order == "desc")
            assert row_ids(client.get(f"/?sort={sort}&order={order}").text) == expected, (sort, order)
    assert row_ids(client.get("/?sort=model&order=asc").text)[-1] == debug  # gpt2 < llama-debug

    # Header links: the active column flips its order; others start at their natural order.
    html = client.get("/?sort=mfu&order=desc").text
    assert 'href="/?sort=mfu&amp;order=asc"' in html and 'aria-sort="descending"' in html
    assert 'href="/?sort=model"' in html

    assert row_ids(client.get("/?gpu=cpu").text) == [debug]
    assert row_ids(client.get("/?gpu=H100").text) == [small, gpt2]  # an alias finds the catalog name
    assert row_ids(client.get("/?model=GPT2").text) == [small, gpt2]
    assert row_ids(client.get("/?q=baseline").text) == [gpt2]
    assert row_ids(client.get("/?nodes=1&q=four").text) == [small]
    nothing = client.get("/?q=zzz").text
    assert 'id="no-matches"' in nothing and 'id="empty-plans"' not in nothing

    first_page = client.get("/?limit=2&sort=mfu").text
    assert len(row_ids(first_page)) == 2
    next_href = re.search(r'href="([^"]+)" id="next-page"', first_page)
    assert next_href
    second_page = client.get(next_href.group(1).replace("&amp;", "&")).text
    assert set(row_ids(first_page)) | set(row_ids(second_page)) == {gpt2, debug, small}
    assert 'id="first-page"' in second_page and 'id="next-page"' not in second_page

    cursor = re.search(r"cursor=([A-Za-z0-9_-]+)", next_href.group(1)).group(1)
    stale = client.get(f"/?sort=model&cursor={cursor}")  # a cursor issued for another sort
    assert stale.status_code == 200 and "showing the first page" in stale.text
    bogus = client.get("/?sort=bogus&order=sideways&nodes=-1&limit=0")
    assert bogus.status_code == 200
    assert "Unknown sort" in bogus.text and "Unknown order" in bogus.text and "Nodes must be" in bogus.text


def test_compare_highlights_differences_and_best_values(client: TestClient) -> None:
    gpt2 = create_plan(client, name="eight GPUs")
    small = create_plan(client, gpus_per_node="4", name="four GPUs")
    for query in (f"ids={gpt2},{small}", f"ids={gpt2}&ids={small}"):
        response = client.get(f"/compare?{query}")
        assert response.status_code == 200
        html = response.text
        assert "eight GPUs" in html and "four GPUs" in html
        gpus_row = re.search(r'<tr class="(\w+)">\s*<th scope="row">GPUs</th>', html)
        assert gpus_row and gpus_row.group(1) == "differs"
        model_row = re.search(r'<tr class="(\w+)">\s*<th scope="row">Model</th>', html)
        assert model_row and model_row.group(1) == "same"
        assert 'class="best"' in html
        assert marks(html, "compare-memory", "rect") > 0
    assert client.get(f"/compare?ids={gpt2}").status_code == 400
    too_many = ",".join(str(i) for i in range(1, 11))
    assert client.get(f"/compare?ids={too_many}").status_code == 400


def test_calibration_pages_draw_the_measured_curves(client: TestClient, db: Database) -> None:
    with db.session() as session:
        row = insert_calibration(session, h100_profile())
    listing = client.get("/calibrations").text
    assert "8x H100 node a17" in listing and "NVIDIA H100 80GB HBM3 × 8" in listing
    assert f'href="/calibrations/{row.id}"' in listing

    html = client.get(f"/calibrations/{row.id}").text
    assert marks(html, "matmul", "circle") == 12  # every GEMM sample
    assert marks(html, "matmul", "path") == 2  # the fitted curve per dtype
    assert marks(html, "collective", "circle") == 33 and marks(html, "collective", "path") == 3
    # Efficiency is achieved over the datasheet peak: the largest bf16 GEMM reaches about 72%.
    assert re.search(r"8192×8192 @ 8192×8192 bfloat16: [0-9.]+TFLOP/s = 7[01]\.\d% of peak", html)
    assert "GEMM efficiency" in html and "Intra-node bus bandwidth" in html and "NV18" in html
    assert "Intra-node latency per group doubling" in html and "Intra-node latency at 8 ranks" in html
    assert "79.1 GiB usable of 79.6 GiB" in html and "Compiled compute scale" in html

    form = client.get("/plans/new").text
    assert f'<option value="{row.id}">#{row.id} 8x H100 node a17' in form
    plan_id = create_plan(client, calibration_id=str(row.id))
    assert f"profile {row.id}" in client.get(f"/plans/{plan_id}").text
    assert f'href="/plans/{plan_id}"' in client.get(f"/calibrations/{row.id}").text


def fitted_cells(html: str, label: str) -> list[str]:
    """The cells of one row of the fitted-parameters table, as text: per precision fitted, catalog."""
    row = re.search(rf'<th scope="row">{re.escape(label)}</th>(.*?)</tr>', html, re.S)
    assert row, f"no row {label!r}"
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row[1], re.S)]


def test_the_fit_says_what_was_not_measured_and_quotes_the_cli_latency(client: TestClient) -> None:
    """A CPU profile ran nothing in bfloat16: its bf16 column does not pass catalog values off as
    fitted; the latency shown is the one `fsdp-planner calibrate` prints, at 8 ranks (issue 24, item 7)."""
    profile = cpu_profile()
    created = client.post("/api/v1/calibrations", json=profile)
    assert created.status_code == 201, created.text
    html = client.get(f"/calibrations/{created.json()['id']}").text
    assert '<th scope="colgroup" colspan="2" class="num">bf16</th>' in html
    bf16_fitted, bf16_catalog, fp32_fitted, fp32_catalog = fitted_cells(html, "GEMM efficiency")
    assert bf16_fitted == "not measured" and bf16_catalog.endswith("%")
    assert fp32_fitted.endswith("%") and fp32_fitted != fp32_catalog  # fp32 GEMMs were timed
    assert "Nothing in this profile ran in bfloat16" in html and "ran in float32" not in html
    # Collectives do not depend on the dtype: measured in both columns, and quoted as the CLI does.
    console = Console(record=True, width=200)
    show_fit(CalibrationProfile.model_validate(profile), console)
    cli = re.search(r"intra-node latency at 8 ranks\s*│\s*(\S+ \S+)\s*│\s*(\S+ \S+)", console.export_text())
    assert cli, console.export_text()
    page = fitted_cells(html, "Intra-node latency at 8 ranks")
    assert page[2:] == [cli[2], cli[1]]  # fp32 (the CLI fits a CPU profile in fp32): fitted, catalog
    assert page[0] == page[2]


def test_accuracy_page_plots_every_run(client: TestClient, db: Database) -> None:
    first = create_plan(client)
    second = create_plan(client, **DEBUG_CPU_FORM)
    with db.session() as session:
        insert_runs(session, session.get(PlanRow, first), 3, seed=1)
        insert_runs(session, session.get(PlanRow, second), 2, seed=2)
    html = client.get("/accuracy").text
    assert marks(html, "step-time", "circle") == 5
    assert marks(html, "memory-accuracy", "circle") == 5
    assert [t["name"] for t in traces(plot(html, "step-time"), "guide")] == ["y = x (perfect prediction)"]
    assert marks(html, "errors", "rect") >= 2
    assert re.search(r'<th scope="row">step time</th><td class="num">5</td>', html)
    detail = client.get(f"/plans/{first}").text
    assert 'id="runs-table"' in detail and len(re.findall(r'<td data-label="Run">#', detail)) == 3
    # Each measurement says whether it fell inside the plan's 80% interval.
    plan = client.get(f"/api/v1/plans/{first}").json()["plan"]["prediction"]
    low, high = plan["tokens_per_s_per_gpu_interval"]["low"], plan["tokens_per_s_per_gpu_interval"]["high"]
    with db.session() as session:
        runs = session.query(ValidationRunRow).filter_by(plan_id=first)
        measured = [r.measured_tokens_per_s_per_gpu for r in runs]
    inside = sum(low <= m <= high for m in measured)
    tokens_cells = re.findall(r'data-label="Tokens/s/GPU measured" class="num">[\d,]+<span class="interval '
                              r'run-(inside|outside)">', detail)
    assert tokens_cells.count("inside") == inside and len(tokens_cells) == 3


def test_writes_need_a_key_once_keys_exist(client: TestClient, db: Database) -> None:
    with db.session() as session:
        issued = keys.create_key(session, "ci")
    form = client.get("/plans/new").text
    assert 'id="api_key"' in form
    missing = client.post("/plans/new", data=GPT2_FORM)
    assert missing.status_code == 401
    assert "requires an API key" in error_beside(missing.text, "api_key", "api_key")
    wrong = client.post("/plans/new", data={**GPT2_FORM, "api_key": "fsdpk_00000000_nope"})
    assert wrong.status_code == 401 and "unknown or revoked" in wrong.text
    assert client.get("/api/v1/plans").json()["items"] == []
    assert create_plan(client, api_key=issued.key) >= 1


def test_reads_need_a_key_when_the_server_says_so(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, require_key_for_reads=True)
    with TestClient(create_app(settings)) as client:
        assert client.get("/").status_code == 200  # no key exists yet: open
        engine = create_db_engine(settings.resolved_database_url)
        with create_session_factory(engine)() as session:
            issued = keys.create_key(session, "reader")
        engine.dispose()
        denied = client.get("/", headers=HTML)
        assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic")
        assert "API key as the password" in denied.text
        basic = {"Authorization": "Basic " + base64.b64encode(f"me:{issued.key}".encode()).decode()}
        assert client.get("/", headers=basic).status_code == 200
        # Signed in through the browser prompt, the form needs no key field.
        assert 'id="api_key"' not in client.get("/plans/new", headers=basic).text
        created = client.post("/plans/new", data=GPT2_FORM, headers=basic, follow_redirects=False)
        assert created.status_code == 303


def test_launcher_buttons_link_to_real_archives(client: TestClient) -> None:
    plan_id = create_plan(client)
    html = client.get(f"/plans/{plan_id}").text
    assert f"fsdp-planner launcher --plan-id {plan_id}" in html
    for target in ("torchrun", "slurm", "k8s", "skypilot", "all"):
        link = f"/api/v1/plans/{plan_id}/launcher?target={target}"
        assert f'href="{link}" download' in html
        archive = client.get(link)
        assert archive.status_code == 200 and archive.headers["content-type"] == "application/gzip"


def test_an_oom_run_is_shown_with_a_replan_button_and_left_out_of_accuracy(
    client: TestClient, db: Database
) -> None:
    plan_id = create_plan(client, **DEBUG_CPU_FORM)
    oom = {"outcome": "oom", "oom": {"step": 2, "phase": "backward", "requested_bytes": 8_400_000_000,
                                     "allocated_bytes": 70 * 2**30, "reserved_bytes": 74 * 2**30}}
    run = client.post(f"/api/v1/plans/{plan_id}/runs", json=oom).json()
    with db.session() as session:
        insert_runs(session, session.get(PlanRow, plan_id), 1, seed=3)
    detail = client.get(f"/plans/{plan_id}").text
    row = detail[detail.index(f'id="run-{run["id"]}"'):]
    row = html_module.unescape(row[: row.index("</tr>")])
    assert "out of memory" in row and "OOM at step 2, backward, asked for 7.82 GiB" in row
    assert "70.0 GiB allocated" in row or "70.00 GiB allocated" in row, row
    assert f'action="/plans/{plan_id}/replan"' in row and f'value="{run["id"]}"' in row
    accuracy = client.get("/accuracy").text
    assert marks(accuracy, "step-time", "circle") == 1  # the completed run only

    form = {"run_id": str(run["id"])}
    replanned = client.post(f"/plans/{plan_id}/replan", data=form, follow_redirects=False)
    assert replanned.status_code == 303, replanned.text
    # A re-plan is a job: its page shows it while it runs, then leads to the new plan.
    job_page = replanned.headers["location"]
    assert job_page.startswith("/plan-jobs/")
    for _ in range(600):
        followed = client.get(job_page, follow_redirects=False)
        if followed.status_code == 303:
            break
        assert followed.status_code == 200 and 'id="plan-job"' in followed.text, followed.text
        time.sleep(0.05)
    assert followed.status_code == 303 and followed.headers["location"].startswith("/plans/")
    new_page = client.get(followed.headers["location"]).text
    assert 'id="replanned-notice"' in new_page and f'href="/plans/{plan_id}"' in new_page
    assert f"after its run #{run['id']} ran out of memory" in new_page
    missing = client.post(f"/plans/{plan_id}/replan", data={"run_id": "999999"})
    assert missing.status_code == 422
    assert "is not a validation run of plan" in html_module.unescape(missing.text)
