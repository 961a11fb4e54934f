"""The what-if study pages, server-side: the list, the form (and its refusals beside their fields), the
study page's picks, tables and links; while the study's job runs, its progress bar and cancel button,
and a failed job's reason."""

from __future__ import annotations

import re
import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import update

from api import keys
from api.dashboard.formatting import dollars
from api.db.models import StudyRow
from tests.dashboard.conftest import Database
from tests.dashboard.figures import plot, traces

STUDY_FORM = {
    "model": "gpt2", "token_budget": "10B", "gpu": ["H100-SXM-80GB", "A100-80GB"],
    "price_H100-SXM-80GB": "2.5", "price_A100-80GB": "1.5", "sizes": "1,8,12,16", "seq_len": "1024",
    "batch_rule": "fixed", "batch_tokens": "262144", "precision": "bf16", "deadline_days": "1",
}


def submit_study(client: TestClient, **overrides: object) -> int:
    """The form sent: 303 to the study's page at once (its job queued); the study's id."""
    response = client.post("/studies/new", data={**STUDY_FORM, **overrides}, follow_redirects=False)
    assert response.status_code == 303, response.text
    match = re.fullmatch(r"/studies/(\d+)", response.headers["location"])
    assert match, response.headers["location"]
    return int(match.group(1))


def wait_for_study(client: TestClient, study_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (study := client.get(f"/api/v1/studies/{study_id}").json())["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, study
        time.sleep(0.05)
    return study


def create_study(client: TestClient, **overrides: object) -> int:
    """A study sent through the form and planned (its job succeeded)."""
    study_id = submit_study(client, **overrides)
    assert wait_for_study(client, study_id)["state"] == "succeeded"
    return study_id


def field_errors(html: str) -> dict[str, str]:
    return {name: re.sub(r"\s+", " ", text).strip() for name, text in re.findall(
        r'<p class="field-error" id="error-([^"]+)" role="alert">(.*?)</p>', html, re.S)}


def test_empty_list_explains_studies_and_links_the_form(client: TestClient) -> None:
    html = client.get("/studies").text
    assert 'id="empty-studies"' in html and 'href="/studies/new"' in html
    assert "fsdp-planner whatif" in html
    assert '<a href="/studies" aria-current="page">Studies</a>' in html


def test_form_creates_a_study_and_its_page_shows_picks_rows_and_reasons(client: TestClient) -> None:
    study_id = create_study(client, name="<b>gpt2</b> what-if")
    html = client.get(f"/studies/{study_id}").text
    assert "&lt;b&gt;gpt2&lt;/b&gt; what-if" in html and "<b>gpt2</b>" not in html
    api = client.get(f"/api/v1/studies/{study_id}").json()
    fitting = [p for p in api["points"] if p["fits"]]

    # Picks: a card per recommended cluster (cheapest within the deadline, cheapest, fastest), each once.
    picks = re.search(r'<section class="headline picks"[^>]*>(.*?)</section>', html, re.S)
    assert picks
    cards = re.findall(r'<div class="metric pick" id="pick-(\w+)">(.*?)</div>', picks.group(1), re.S)
    positions = {api["cheapest"], api["fastest"], api["cheapest_within_deadline"]} - {None}
    assert len(cards) == len(positions)
    for position in positions:
        point = api["points"][position]
        link = f'href="/plans/{point["plan_id"]}"'
        assert any(point["cluster"] in body and link in body for _, body in cards)
    cheapest = api["points"][api["cheapest"]]
    if api["cheapest_within_deadline"] == api["cheapest"]:
        assert "Cheapest within 1 day; cheapest overall" in picks.group(1)

    # Every fitting cluster is a row, cheapest first, with its plan and launcher links.
    table = re.search(r'<table class="data" id="study-points">(.*?)</table>', html, re.S)
    assert table
    rows = re.findall(r'<tr id="point-(\d+)"', table.group(1))
    by_cost = sorted(fitting, key=lambda p: (p["cost"], p["days"], p["num_gpus"], p["position"]))
    assert [int(r) for r in rows] == [p["position"] for p in by_cost]
    for point in fitting:
        assert f'href="/plans/{point["plan_id"]}"' in table.group(1)
        assert f'href="/api/v1/plans/{point["plan_id"]}/launcher"' in table.group(1)
    # Each with the 80% intervals of its peak, days and cost, and the chart draws days and cost as bars.
    assert table.group(1).count('<span class="interval">') == 3 * len(fitting)
    for point in fitting:
        cost = point["cost_interval"]
        assert f'{dollars(cost["low"])}–{dollars(cost["high"])}' in table.group(1)
    bars = [t for t in traces(plot(html, "study")) if "error_x" in t]
    assert bars and all("error_y" in t for t in bars)

    # The clusters that cannot train it, with why.
    refused = re.search(r'<table class="data" id="study-refused">(.*?)</table>', html, re.S)
    assert refused and "12xH100-SXM-80GB" in refused.group(1)
    assert "not a whole number of 8-GPU H100-SXM-80GB nodes" in refused.group(1)

    # The inputs, prices as entered.
    assert "H100-SXM-80GB $2.5/GPU-hour, A100-80GB $1.5/GPU-hour" in html
    assert "1, 8, 12, 16 GPUs" in html

    plan_page = client.get(f"/plans/{cheapest['plan_id']}").text
    assert f'<a href="/studies/{study_id}">study #{study_id} &lt;b&gt;gpt2&lt;/b&gt; what-if</a>' in plan_page

    listed = client.get("/studies").text
    assert f'href="/studies/{study_id}"' in listed and "6 of 8" in listed


def test_refusals_are_shown_beside_their_fields_and_store_nothing(client: TestClient) -> None:
    cases = [
        ({"token_budget": "lots"}, "token_budget", "cannot read 'lots' as a token count"),
        ({"token_budget": "1e30"}, "token_budget", "out of range: give 1 to 10,000,000,000,000,000 tokens"),
        ({"price_H100-SXM-80GB": "0"}, "price_H100-SXM-80GB", "greater than 0"),
        ({"price_A100-80GB": "-1"}, "price_A100-80GB", "greater than 0"),
        ({"gpu": []}, "gpus", "tick at least one GPU type"),
        ({"sizes": "64-8"}, "sizes", "the range from 64 to 8 GPUs is empty"),
        ({"sizes": "many"}, "sizes", "cannot read 'many'"),
        ({"batch_tokens": "1000"}, "batch_tokens", "not a whole number of 1024-token sequences"),
        ({"deadline_days": "soon"}, "deadline_days", "as a number"),
    ]
    for overrides, field, words in cases:
        response = client.post("/studies/new", data={**STUDY_FORM, **overrides}, follow_redirects=False)
        assert response.status_code == 422, (overrides, response.status_code)
        errors = field_errors(response.text)
        assert field in errors and words in errors[field].replace("&#39;", "'"), (overrides, errors)
        assert 'id="form-problem"' in response.text
        # The form comes back as it was sent.
        for name, value in overrides.items():
            if isinstance(value, str) and name != "gpu":
                assert f'value="{value}"' in response.text
    assert client.get("/api/v1/studies").json()["items"] == []


def test_the_form_pins_mesh_axes_on_every_cluster(client: TestClient) -> None:
    # A pin field per axis with a search field (contract/mesh.py's registry), as the plan form has.
    form = client.get("/studies/new").text
    for name in ("tensor_parallel_degree", "context_parallel_degree", "pipeline_parallel_degree"):
        assert f'id="{name}"' in form, name
    study_id = submit_study(client, sizes="1,8", tensor_parallel_degree="1")
    stored = client.get(f"/api/v1/studies/{study_id}").json()["request"]
    assert stored["search"]["tensor_parallel_degrees"] == [1]
    refused = client.post("/studies/new", data={**STUDY_FORM, "pipeline_parallel_degree": "\u00b2"})
    assert refused.status_code == 422
    assert field_errors(refused.text)["pipeline_parallel_degree"].startswith("enter a whole number from 1 to")


def test_missing_studies_are_404_pages(client: TestClient) -> None:
    for path in ("/studies/999", "/studies/abc", "/studies/0"):
        response = client.get(path)
        assert response.status_code == 404 and "<html" in response.text


def test_a_deleted_plan_leaves_its_row_without_links(client: TestClient) -> None:
    study_id = create_study(client)
    point = next(p for p in client.get(f"/api/v1/studies/{study_id}").json()["points"] if p["fits"])
    assert client.delete(f"/api/v1/plans/{point['plan_id']}").status_code == 204
    page = client.get(f"/studies/{study_id}").text
    row = re.search(rf'<tr id="point-{point["position"]}"[^>]*>(.*?)</tr>', page, re.S)
    assert row and "deleted" in row.group(1) and "/plans/" not in row.group(1)


def test_with_a_key_stored_the_form_asks_for_it(client: TestClient, db: Database) -> None:
    with db.session() as session:
        issued = keys.create_key(session, "ci")
    assert 'id="api_key"' in client.get("/studies/new").text
    missing = client.post("/studies/new", data=STUDY_FORM, follow_redirects=False)
    assert missing.status_code == 401 and "requires an API key" in field_errors(missing.text)["api_key"]
    assert client.get("/api/v1/studies").json()["items"] == []
    assert create_study(client, api_key=issued.key) >= 1


def test_a_study_in_progress_shows_its_progress_and_can_be_cancelled(
    client: TestClient, db: Database
) -> None:
    study_id = create_study(client)
    # As a page shows a queued or running study (set here: a real one finishes in a blink).
    with db.session() as session:
        session.execute(update(StudyRow).where(StudyRow.id == study_id).values(
            state="running", candidates_done=3, num_fitting=2,
            best_so_far={**client.get(f"/api/v1/studies/{study_id}").json()["points"][0], "cost": 1234.0}))
        session.commit()
    html = client.get(f"/studies/{study_id}").text
    job = re.search(r'<section class="job" id="study-job"[^>]*>(.*?)</section>', html, re.S)
    assert job and 'data-state="running"' in html, html
    assert '<progress id="study-progress" max="8" value="3"' in job.group(1)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", job.group(1)))
    assert "3 of 8 clusters searched · 2 fit so far · cheapest so far: 1x1xH100-SXM-80GB, $1.23K" in text
    assert 'id="study-picks"' not in html  # the results come once it has succeeded
    assert "running: 3 of 8 searched" in client.get("/studies").text

    cancelled = client.post(f"/studies/{study_id}/cancel", follow_redirects=False)
    assert cancelled.status_code == 303 and cancelled.headers["location"] == f"/studies/{study_id}"
    assert client.get(f"/api/v1/studies/{study_id}").json()["state"] == "cancelled"
    assert 'id="study-cancelled"' in client.get(f"/studies/{study_id}").text
    assert ">cancelled</td>" in client.get("/studies").text  # the list says so instead of "0 of 8"
    assert client.post("/studies/999/cancel", follow_redirects=False).status_code == 404


def test_a_failed_study_shows_its_reason(client: TestClient, db: Database) -> None:
    study_id = create_study(client)
    with db.session() as session:
        session.execute(update(StudyRow).where(StudyRow.id == study_id).values(
            state="failed", error="calibration profile 7 does not exist; upload one <again>"))
        session.commit()
    html = client.get(f"/studies/{study_id}").text
    assert '<p class="notice error" id="study-error" role="alert">calibration profile 7 does not exist; ' \
        "upload one &lt;again&gt;</p>" in html


def test_rack_gpus_take_their_scale_up_domain(client: TestClient) -> None:
    # GB200 and GB300 (NVL72 racks) have a domain field; an NVL36 study's plans are in domains of 36.
    form = client.get("/studies/new").text
    assert 'id="domain_GB200"' in form and 'id="domain_GB300"' in form
    assert 'id="domain_H100-SXM-80GB"' not in form
    study_id = create_study(client, gpu=["GB200"], **{"price_GB200": "5", "domain_GB200": "36"},
                            sizes="72", batch_tokens=str(1024 * 288))
    api = client.get(f"/api/v1/studies/{study_id}").json()
    assert api["request"]["gpus"][0]["scaleup_domain_gpus"] == 36
    (point,) = api["points"]
    assert point["cluster"] == "2x36xGB200"
    assert "GB200 (domains of 36) $5/GPU-hour" in client.get(f"/studies/{study_id}").text
    refused = client.post("/studies/new", data={**STUDY_FORM, "gpu": ["GB200"], "price_GB200": "5",
                                                "domain_GB200": "30", "sizes": "72"})
    assert refused.status_code == 422
    assert "30 is not a whole number of 4-GPU nodes" in field_errors(refused.text)["domain_GB200"]
    assert 'value="30"' in refused.text


def test_the_study_page_lists_the_network_among_its_assumptions(client: TestClient) -> None:
    body = {"model": "gpt2", "token_budget": 10**10, "gpus": [{"gpu": "H100"}], "cluster_sizes": [16],
            "seq_len": 1024, "global_batch_tokens": 262144, "inter_node_bandwidth_gbps": 25.0}
    response = client.post("/api/v1/studies", json=body)
    assert response.status_code == 202, response.text
    stated = response.json()["id"]
    assert wait_for_study(client, stated)["state"] == "succeeded"
    text = re.sub(r"\s+", " ", client.get(f"/studies/{stated}").text)
    assert "Network between nodes" in text and "200 Gb/s per GPU (25 GB/s)" in text

    unstated = create_study(client)
    text = re.sub(r"\s+", " ", client.get(f"/studies/{unstated}").text)
    assert "Network between nodes" in text and "catalog NIC" in text and "Gb/s per GPU" not in text
