"""The 80% intervals through the service: the stored and returned Plan document carries them, the plan
and compare pages show them, and a plan stored before schema 2.2 (none) still reads everywhere."""

from __future__ import annotations

import re

import httpx
import pytest
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from contract.plan_document import SCHEMA_VERSION
from tests.api.conftest import cheap_plan
from tests.older_schemas import as_schema_2_1

pytestmark = pytest.mark.anyio
PLANS = "/api/v1/plans"


def _between(low: float, value: float, high: float) -> bool:
    return low < value < high


async def test_the_plan_document_carries_intervals_and_the_pages_show_them(client: httpx.AsyncClient) -> None:
    created = await client.post(PLANS, json=cheap_plan(name="with intervals"))
    assert created.status_code == 201, created.text
    plan = created.json()["plan"]
    assert plan["schema_version"] == SCHEMA_VERSION
    for item in (plan["prediction"], *plan["alternatives"], *plan["pareto_front"]):
        t, m = item["tokens_per_s_per_gpu_interval"], item["peak_memory_gib_interval"]
        assert _between(t["low"], item["tokens_per_s_per_gpu"], t["high"]) and t["level"] == 0.8
        assert _between(m["low"], item["peak_memory_gib"], m["high"]) and m["basis"]
    assert plan["network_assumed"] is False
    # A CPU is no GPU type of the corpus: the plan says its numbers rest on the datasheet alone.
    assert "gpu_outside_corpus" in {w["code"] for w in plan["warnings"]}
    # As stored: GET returns the same document.
    plan_id = created.json()["id"]
    stored = (await client.get(f"{PLANS}/{plan_id}")).json()["plan"]
    assert stored["prediction"] == plan["prediction"] and stored["alternatives"] == plan["alternatives"]

    page = await client.get(f"/plans/{plan_id}")
    assert page.status_code == 200, page.text
    shown = re.search(r'id="metric-throughput-interval"[^>]*>80%: ([\d,]+)–([\d,]+)<', page.text)
    assert shown is not None, page.text
    t = plan["prediction"]["tokens_per_s_per_gpu_interval"]
    assert shown.groups() == (f"{t['low']:,.0f}", f"{t['high']:,.0f}")
    assert 'id="metric-memory-interval"' in page.text and 'id="interval-note"' in page.text
    assert "Throughput interval (80%)" in page.text
    # The trade-off chart draws them as error bars.
    assert '"error_y"' in page.text and '"error_x"' in page.text


async def test_a_plan_stored_before_2_2_still_reads(client: httpx.AsyncClient, session: Session) -> None:
    current = (await client.post(PLANS, json=cheap_plan(name="current"))).json()
    older = (await client.post(PLANS, json=cheap_plan(cluster="1x4xcpu", name="stored by 2.1"))).json()
    row = session.get(PlanRow, older["id"])
    assert row is not None
    row.plan = as_schema_2_1(row.plan)
    session.commit()

    shown = await client.get(f"{PLANS}/{older['id']}")
    assert shown.status_code == 200, shown.text
    document = shown.json()["plan"]
    assert document["schema_version"] == "2.1"
    # Returned as stored (the API serves the stored document), and read by this version's Plan model.
    assert "tokens_per_s_per_gpu_interval" not in document["prediction"] and "network_assumed" not in document
    page = await client.get(f"/plans/{older['id']}")
    assert page.status_code == 200, page.text
    assert "metric-throughput-interval" not in page.text and "interval-note" not in page.text
    # Compared with a current plan: the intervals are `–` (not applicable), the current one's shown.
    api = await client.get(f"{PLANS}/compare", params={"ids": f"{current['id']},{older['id']}"})
    assert api.status_code == 200, api.text
    rows = {row["field"]: row["values"] for row in api.json()["fields"]}
    interval = rows["prediction.tokens_per_s_per_gpu_interval"]
    assert re.fullmatch(r"[\d,]+–[\d,]+", interval[0]) and interval[1] is None
    assert rows["network_assumed"] == [False, None]
    compare_page = await client.get(f"/compare?ids={current['id']},{older['id']}")
    assert compare_page.status_code == 200, compare_page.text
    assert "Tokens/s per GPU, 80% interval" in compare_page.text


async def test_a_cluster_without_its_network_says_so(client: httpx.AsyncClient) -> None:
    assumed = (await client.post(PLANS, json=cheap_plan(cluster="2x2xcpu", name="no network"))).json()
    stated = (await client.post(PLANS, json=cheap_plan(
        cluster={"num_nodes": 2, "gpus_per_node": 2, "gpu": "cpu", "inter_node_bandwidth_gbps": 1.25},
        name="network stated",
    ))).json()
    assert assumed["plan"]["network_assumed"] is True and stated["plan"]["network_assumed"] is False
    assert "network not stated" in assumed["plan"]["prediction"]["tokens_per_s_per_gpu_interval"]["basis"]
    page = (await client.get(f"/plans/{assumed['id']}")).text
    assert 'id="warning-network_assumed"' in page and "the network the cluster did not state" in page
    other = (await client.get(f"/plans/{stated['id']}")).text
    assert 'id="warning-network_assumed"' not in other and "did not state" not in other
