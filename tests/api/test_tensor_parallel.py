"""Tensor parallelism through the API: a pinned degree is planned, stored, listed and filtered by;
a pin the model or cluster cannot take is a 422 naming the field; a pin that cannot fit is infeasible."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from planner.plan import Plan
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
FIELD = "search.tensor_parallel_degrees"
FOUR_CPU_RANKS = cheap_plan(cluster="1x4xcpu", training={"seq_len": 128, "global_batch_tokens": 128 * 16})
# Llama 3 8B at 128k tokens per sequence: its activations fit on an H100 only split over tp ranks.
LONG_CONTEXT = {
    "model": "llama3-8b", "cluster": "1x8xH100",
    "training": {"seq_len": 131072, "global_batch_tokens": 131072 * 8},
}


def count_plans(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(PlanRow)) or 0


def pinned(body: dict[str, Any], *degrees: Any) -> dict[str, Any]:
    return {**body, "search": {"tensor_parallel_degrees": list(degrees)}}


async def test_a_pinned_degree_is_planned_stored_and_listed(
    client: httpx.AsyncClient, session: Session
) -> None:
    free = await client.post(PLANS, json=FOUR_CPU_RANKS)
    assert free.status_code == 201, free.text
    assert free.json()["mesh"]["tp"] == 1  # left to itself, this search picks no TP

    response = await client.post(PLANS, json=pinned(FOUR_CPU_RANKS, 2))
    assert response.status_code == 201, response.text
    body = response.json()
    plan = Plan.model_validate(body["plan"])
    assert plan.config.mesh.tp == 2 and plan.config.mesh.dp == 2
    assert body["request"]["search"]["tensor_parallel_degrees"] == [2]
    assert body["mesh"]["tp"] == 2 and body["sharding"] == plan.config.sharding
    assert body["mesh"] == plan.config.mesh.as_document()
    assert plan.prediction.exposed_tensor_parallel_s > 0
    # Pinned: the alternatives and the rejected families are tp=2 ones only.
    assert all(c.config.mesh.tp == 2 for c in plan.alternatives)
    assert all("tp2" in r.family.split() for r in plan.rejected)
    row = session.get(PlanRow, body["id"])
    assert row is not None and (row.mesh["tp"], row.mesh["dp_shard"]) == (2, 2)

    listed = (await client.get(PLANS, params={"tp": 2})).json()["items"]
    assert [item["id"] for item in listed] == [body["id"]]
    assert listed[0]["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "ep": 1, "cp": 1, "tp": 2}
    data_parallel = (await client.get(PLANS, params={"tp": 1})).json()["items"]
    assert [item["id"] for item in data_parallel] == [free.json()["id"]]


async def test_a_pin_written_as_a_float_is_the_integer(client: httpx.AsyncClient) -> None:
    """JSON has one number type: [2.0] pins tp=2 (as 8.0 is 8 in every integer field); 2.5 is refused."""
    response = await client.post(PLANS, json=pinned(FOUR_CPU_RANKS, 2.0))
    assert response.status_code == 201, response.text
    assert response.json()["mesh"]["tp"] == 2
    assert response.json()["request"]["search"]["tensor_parallel_degrees"] == [2]
    problem = assert_problem(await client.post(PLANS, json=pinned(FOUR_CPU_RANKS, 2.5)), 422)
    assert f"{FIELD}.0" in [error["field"] for error in problem["errors"]]


@pytest.mark.parametrize(
    ("body", "field", "needles"),
    [
        # 3 divides neither the heads nor the node: the planner says what tp must divide.
        (pinned(FOUR_CPU_RANKS, 3), FIELD, ["tp=3 must divide", "num_heads 8", "gpus_per_node 4"]),
        (pinned(FOUR_CPU_RANKS, 8), FIELD, ["tp=8 must divide", "gpus_per_node 4"]),
        (pinned(cheap_plan(model="gpt2"), 2), FIELD, ["llama-family"]),
        (pinned(FOUR_CPU_RANKS), FIELD, ["at least one"]),
        (pinned(FOUR_CPU_RANKS, 0), f"{FIELD}.0", ["0 is not a tensor-parallel degree: give whole numbers"]),
        (pinned(FOUR_CPU_RANKS, "2"), f"{FIELD}.0", ["integer"]),
    ],
)
async def test_a_bad_pin_is_422_naming_the_field(
    client: httpx.AsyncClient, session: Session, body: dict[str, Any], field: str, needles: list[str]
) -> None:
    problem = assert_problem(await client.post(PLANS, json=body), 422)
    assert field in [error["field"] for error in problem["errors"]], problem
    for needle in needles:
        assert needle in problem["detail"], problem["detail"]
    assert count_plans(session) == 0


async def test_a_pin_that_cannot_fit_is_infeasible(client: httpx.AsyncClient, session: Session) -> None:
    # Data parallelism only: tp pinned to 1, and context parallelism (which would fit it) too.
    data_only = {**LONG_CONTEXT, "search": {"tensor_parallel_degrees": [1], "context_parallel_degrees": [1]}}
    problem = assert_problem(await client.post(PLANS, json=data_only), 422, "infeasible-plan")
    assert "does not fit" in problem["detail"] and problem["needs_model_parallelism"] is True
    assert "widen search.tensor_parallel_degrees" in problem["detail"]
    assert problem["min_peak_memory_gib"] > problem["capacity_gib"]
    assert count_plans(session) == 0
    # Unpinned, the search finds the tensor- or context-parallel plans that fit.
    response = await client.post(PLANS, json=LONG_CONTEXT)
    assert response.status_code == 201, response.text
    mesh = response.json()["mesh"]
    assert mesh["tp"] * mesh["cp"] > 1
