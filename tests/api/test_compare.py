"""GET /api/v1/plans/compare: stored plans side by side, on SQLite and PostgreSQL, agreeing with the
dashboard's compare page (one comparison behind both)."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio


async def _create(client: httpx.AsyncClient, **overrides: Any) -> int:
    response = await client.post("/api/v1/plans", json=cheap_plan(**overrides))
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


async def _two_plans(client: httpx.AsyncClient) -> tuple[int, int]:
    two = await _create(client, name="two ranks")
    four = await _create(client, cluster="1x4xcpu", name="four ranks")
    return two, four


async def test_compare_returns_configs_predictions_and_differences(client: httpx.AsyncClient) -> None:
    two, four = await _two_plans(client)
    response = await client.get("/api/v1/plans/compare", params={"ids": f"{four},{two}"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ids"] == [four, two]
    assert [p["id"] for p in body["plans"]] == [four, two]
    assert [p["name"] for p in body["plans"]] == ["four ranks", "two ranks"]
    for plan in body["plans"]:
        assert {"sharding", "micro_batch_size", "checkpointing"} <= set(plan["config"])
        assert {"step_time_s", "peak_memory_gib", "memory_breakdown_gib"} <= set(plan["prediction"])
        assert plan["training"]["seq_len"] == 256

    fields = {f["field"]: f for f in body["fields"]}
    assert fields["cluster.world_size"]["values"] == [4, 2] and fields["cluster.world_size"]["differs"]
    assert fields["model.name"]["values"] == ["llama-debug"] * 2 and not fields["model.name"]["differs"]
    assert body["differences"] == [f["field"] for f in body["fields"] if f["differs"]]
    assert "cluster" in body["differences"] and "training.seq_len" not in body["differences"]
    # The best prediction is marked in the direction that is better.
    step = fields["prediction.step_time_s"]
    assert step["values"] == [p["prediction"]["step_time_s"] for p in body["plans"]]
    assert step["best"] == [step["values"].index(min(step["values"]))]
    tokens = fields["prediction.tokens_per_s_per_gpu"]
    assert tokens["best"] == [tokens["values"].index(max(tokens["values"]))]
    assert fields["cluster"]["best"] == []  # an input has no "better"


async def test_compare_agrees_with_the_dashboard_page(client: httpx.AsyncClient) -> None:
    two, four = await _two_plans(client)
    api = (await client.get(f"/api/v1/plans/compare?ids={two},{four}")).json()
    page = await client.get(f"/compare?ids={two},{four}")
    assert page.status_code == 200
    rows = re.findall(r'<tr class="(differs|same)">\s*<th scope="row">([^<]+)</th>', page.text)
    assert [(html.unescape(label), kind == "differs") for kind, label in rows] == [
        (f["label"], f["differs"]) for f in api["fields"]
    ]
    best_cells = len(re.findall(r'<td class="best"', page.text))
    assert best_cells == sum(len(f["best"]) for f in api["fields"])


async def test_repeated_ids_work_like_the_dashboard(client: httpx.AsyncClient) -> None:
    two, four = await _two_plans(client)
    response = await client.get(f"/api/v1/plans/compare?ids={two}&ids={four}")
    assert response.status_code == 200, response.text
    assert response.json()["ids"] == [two, four]


async def test_unknown_ids_are_named(client: httpx.AsyncClient) -> None:
    two, _ = await _two_plans(client)
    body = assert_problem(await client.get(f"/api/v1/plans/compare?ids={two},987654"), 404, "plan-not-found")
    assert body["detail"].startswith("plan(s) 987654 do not exist")
    assert body["missing_ids"] == [987654]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("ids=5", "between 2 and 8 different plans to compare (1 given)"),
        ("ids=5,5", "between 2 and 8 different plans to compare (1 given)"),
        ("ids=" + ",".join(str(i) for i in range(1, 10)), "(9 given)"),
        ("ids=a,b", "'a,b' is not a list of plan ids"),
        ("ids=3,", "'3,' is not a list of plan ids"),
        ("ids=0,4", "'0' is not a plan id"),
        ("ids=99999999999999999999,4", "is not a plan id"),
    ],
)
async def test_bad_ids_get_a_422_naming_the_field_and_the_fix(
    client: httpx.AsyncClient, query: str, says: str
) -> None:
    body = assert_problem(await client.get(f"/api/v1/plans/compare?{query}"), 422, "invalid-request")
    assert says in body["detail"] and "e.g. ids=3,7" in body["detail"]
    assert [(e["location"], e["field"]) for e in body["errors"]] == [("query", "ids")]


async def test_a_plan_this_version_cannot_read_is_a_422_not_a_500(
    client: httpx.AsyncClient, session: Session
) -> None:
    two, four = await _two_plans(client)
    session.execute(update(PlanRow).where(PlanRow.id == four).values(plan={"schema_version": "1.0"}))
    session.commit()
    body = assert_problem(await client.get(f"/api/v1/plans/compare?ids={two},{four}"), 422, "invalid-request")
    assert f"plan {four} was stored by planner" in body["detail"]
    assert f"/api/v1/plans/{four}" in body["detail"]  # where its raw JSON still is
    assert body["errors"][0]["field"] == "ids"


async def test_missing_ids_parameter_names_it(client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.get("/api/v1/plans/compare"), 422, "invalid-request")
    assert body["errors"][0]["field"] == "ids"


async def test_compare_is_documented_and_not_taken_for_a_plan_id(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    parameters = schema["paths"]["/api/v1/plans/compare"]["get"]["parameters"]
    assert parameters[0]["name"] == "ids" and parameters[0]["schema"]["pattern"]
    # Not a plan id for any method: DELETE is refused with what the path serves ...
    refused = assert_problem(await client.delete("/api/v1/plans/compare"), 405)
    assert refused["detail"] == "DELETE is not allowed on /api/v1/plans/compare"
    assert (await client.options("/api/v1/plans/compare")).headers["allow"] == "GET, OPTIONS"
    # ... while a word where a plan id belongs is still a 422 naming plan_id.
    wrong = assert_problem(await client.get("/api/v1/plans/comparison"), 422, "invalid-request")
    assert wrong["errors"][0]["field"] == "plan_id"
