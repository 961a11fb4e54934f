"""Tensor parallelism on the dashboard, server-side: the form's degree pin, the mesh on the plan page
(with the exposed tensor-parallel time and the rejected tp families), the list's Mesh column and its
sharding / tp filters, and the compare page's mesh rows."""

from __future__ import annotations

import html as html_module
import re

from fastapi.testclient import TestClient

from api.dashboard import formatting as fmt
from contract.mesh import Mesh
from tests.dashboard.conftest import DEBUG_CPU_FORM, create_plan
from tests.dashboard.test_pages import error_beside, row_ids

# llama-debug on four CPU ranks: left to itself the search picks data parallelism (and says why
# tp=2 and tp=4 lost); pinned, it plans tp=2 over dp 2.
FOUR_RANKS = {**DEBUG_CPU_FORM, "gpus_per_node": "4", "seq_len": "128", "global_batch_tokens": "2048"}


def text(html: str) -> str:
    """The page's text, tags dropped and whitespace collapsed (to read labelled rows)."""
    return " ".join(html_module.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def mesh_cells(html: str) -> dict[int, str]:
    rows = re.findall(r'<tr data-plan-id="(\d+)">.*?<td data-label="Mesh" class="cell-mesh"[^>]*>(.*?)</td>',
                      html, re.S)
    return {int(plan_id): text(cell) for plan_id, cell in rows}


def test_a_pinned_plan_shows_its_mesh_and_tensor_parallel_time(client: TestClient) -> None:
    plan_id = create_plan(client, **FOUR_RANKS, tensor_parallel_degree="2", name="debug tp2")
    stored = client.get(f"/api/v1/plans/{plan_id}").json()
    plan = stored["plan"]
    assert stored["request"]["search"]["tensor_parallel_degrees"] == [2]
    assert plan["config"]["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "ep": 1, "cp": 1, "tp": 2}

    page = text(client.get(f"/plans/{plan_id}").text)
    assert f"· {plan['config']['sharding']} dp2x1 tp2 " in page  # the configuration label in the subtitle
    assert "Device mesh dp_replicate 1 × dp_shard 2 × tp 2" in page
    assert ("each tp group is 2 consecutive ranks inside a scale-up domain (a node, or an NVLink rack), with "
            "sequence parallel and loss parallel") in page
    tensor_parallel = fmt.duration(plan["prediction"]["exposed_tensor_parallel_s"])
    assert f"Tensor-parallel communication {tensor_parallel} per step, all exposed" in page
    assert f"tensor parallel {tensor_parallel}" in page  # in the exposed communication's breakdown
    assert f"Tensor-parallel collectives ({tensor_parallel} per step over tp=2)" in page
    # "Plan again with changes" keeps the pin, and the form comes back with it.
    html = client.get(f"/plans/{plan_id}").text
    again = re.search(r'href="(/plans/new\?[^"]+)" id="replan"', html)
    assert again and "tensor_parallel_degree=2" in again.group(1)
    form = client.get(html_module.unescape(again.group(1))).text
    assert re.search(r'id="tensor_parallel_degree"[^>]*value="2"', form)


def test_an_unpinned_plan_says_why_the_tp_families_lost(client: TestClient) -> None:
    plan_id = create_plan(client, **FOUR_RANKS, name="debug free")
    plan = client.get(f"/api/v1/plans/{plan_id}").json()["plan"]
    assert plan["config"]["mesh"]["tp"] == 1
    # A row is labelled with its configuration's whole mesh: each degree that lost has its rows.
    tp_families = [r for r in plan["rejected"] if "tp1" not in r["family"].split()]
    degrees = {word for r in tp_families for word in r["family"].split() if word.startswith("tp")}
    assert degrees == {"tp2", "tp4"}
    html = client.get(f"/plans/{plan_id}").text
    table = re.search(r'<table class="data cards" id="rejected-table">(.*?)</table>', html, re.S)
    assert table
    for rejected in tp_families:
        assert f"<code>{rejected['family']}</code>" in table.group(1)
        assert html_module.escape(rejected["reason"]) in table.group(1)
    page = text(html)
    assert "Device mesh dp_replicate 1 × dp_shard 4 × tp 1 4 GPUs, data parallelism only" in page
    assert "Tensor-parallel communication" not in page and 'id="timeline-tensor-parallel"' not in html


def test_the_list_shows_the_mesh_and_filters_by_sharding_and_tp(client: TestClient) -> None:
    pinned = create_plan(client, **FOUR_RANKS, tensor_parallel_degree="2", name="debug tp2")
    free = create_plan(client, **FOUR_RANKS, name="debug free")
    data_parallel = create_plan(client, **FOUR_RANKS, tensor_parallel_degree="1", name="debug tp1")
    summaries = {p["id"]: p for p in client.get("/api/v1/plans").json()["items"]}

    html = client.get("/").text
    assert '<th scope="col">Mesh</th>' in html
    cells = mesh_cells(html)
    for plan_id, summary in summaries.items():
        expected = f"{summary['sharding']} {Mesh(**summary['mesh']).label()}"
        assert cells[plan_id] == expected, (cells, summary)
    assert cells[pinned] == f"{summaries[pinned]['sharding']} dp2x1 tp2"
    assert cells[free] == f"{summaries[free]['sharding']} dp4x1 tp1"
    # The tp choices are the degrees stored plans use.
    assert re.findall(r'<select name="tp" id="filter-tp">(.*?)</select>', html, re.S)[0].count("<option") == 3

    assert row_ids(client.get("/?tp=2").text) == [pinned]
    assert row_ids(client.get("/?tp=1").text) == [data_parallel, free]
    sharding = summaries[pinned]["sharding"]
    expected = [i for i in (data_parallel, free, pinned) if summaries[i]["sharding"] == sharding]
    assert row_ids(client.get(f"/?sharding={sharding}").text) == expected
    assert row_ids(client.get(f"/?sharding={sharding}&tp=2").text) == [pinned]
    filtered = client.get(f"/?sharding={sharding}&tp=2").text
    assert re.search(r'<option value="2" selected>tp 2</option>', filtered)
    assert re.search(rf'<option value="{sharding}" selected>', filtered)
    clear = re.search(r'href="([^"]*)" id="clear-filters"', filtered)
    assert clear and "tp=" not in clear.group(1) and "sharding=" not in clear.group(1)
    assert 'id="no-matches"' in client.get("/?tp=8").text

    bogus = client.get("/?tp=x&sharding=zero3")
    assert bogus.status_code == 200 and len(row_ids(bogus.text)) == 3  # ignored, with a notice each
    assert "Tensor parallel must be a whole number" in bogus.text and "Unknown sharding" in bogus.text


def test_compare_shows_the_mesh_rows(client: TestClient) -> None:
    pinned = create_plan(client, **FOUR_RANKS, tensor_parallel_degree="2", name="debug tp2")
    free = create_plan(client, **FOUR_RANKS, name="debug free")
    page = text(client.get(f"/compare?ids={pinned},{free}").text)
    assert "Tensor parallel (GPUs) 2 (sequence + loss parallel) none (1)" in page
    assert "Shard group (GPUs) 2 4" in page and "Replicas 1 1" in page
    plans = [client.get(f"/api/v1/plans/{i}").json()["plan"] for i in (pinned, free)]
    values = " ".join(fmt.duration(p["prediction"]["exposed_tensor_parallel_s"]) for p in plans)
    assert f"of which tensor parallel {values}" in page


def test_the_form_refuses_a_degree_that_cannot_split_the_model(client: TestClient) -> None:
    for typed, expected in (("3", "tp=3 must divide each of num_heads 8"),
                            ("two", "enter a whole number from 1"),
                            ("0", "enter a whole number from 1")):
        response = client.post("/plans/new", data={**FOUR_RANKS, "tensor_parallel_degree": typed})
        assert response.status_code == 422, typed
        assert expected in error_beside(response.text, "tensor_parallel_degree", "tensor_parallel_degree")
        assert re.search(rf'id="tensor_parallel_degree"[^>]*value="{typed}"', response.text)
    assert client.get("/api/v1/plans").json()["items"] == []
