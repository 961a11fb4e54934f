"""Idempotency-Key: a retried POST replays the first response; the key cannot be reused for another body."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from api.db.base import utcnow
from api.db.models import IdempotencyKeyRow, PlanRow
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"


def key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


async def test_same_key_same_body_replays_the_first_response(
    client: httpx.AsyncClient, session: Session
) -> None:
    first = await client.post(PLANS, json=cheap_plan(), headers=key("retry-1"))
    retry = await client.post(PLANS, json=cheap_plan(), headers=key("retry-1"))
    assert (first.status_code, retry.status_code) == (201, 201)  # the same response, status included
    assert retry.json() == first.json()
    assert retry.headers["location"] == first.headers["location"]
    assert retry.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert session.scalar(select(func.count()).select_from(PlanRow)) == 1
    # Without the key, identical inputs still dedup, but as "already stored".
    assert (await client.post(PLANS, json=cheap_plan())).status_code == 200


async def test_same_key_other_body_is_refused(client: httpx.AsyncClient, session: Session) -> None:
    await client.post(PLANS, json=cheap_plan(), headers=key("k"))
    problem = assert_problem(
        await client.post(PLANS, json=cheap_plan(top_k=1), headers=key("k")), 422, "idempotency-key-reused"
    )
    assert "different request body" in problem["detail"]
    assert problem["errors"][0] == {
        "location": "header",
        "field": "Idempotency-Key",
        "message": "used with another body",
        "type": "idempotency_key_reused",
    }
    assert session.scalar(select(func.count()).select_from(PlanRow)) == 1


async def test_a_new_key_for_a_stored_plan_records_200(client: httpx.AsyncClient) -> None:
    await client.post(PLANS, json=cheap_plan())
    first = await client.post(PLANS, json=cheap_plan(), headers=key("late"))
    again = await client.post(PLANS, json=cheap_plan(), headers=key("late"))
    assert (first.status_code, again.status_code) == (200, 200)


async def test_failed_requests_do_not_burn_the_key(client: httpx.AsyncClient) -> None:
    assert_problem(await client.post(PLANS, json=cheap_plan(model="nope"), headers=key("k2")), 422)
    assert (await client.post(PLANS, json=cheap_plan(), headers=key("k2"))).status_code == 201


async def test_expired_keys_are_forgotten(client: httpx.AsyncClient, session: Session) -> None:
    await client.post(PLANS, json=cheap_plan(), headers=key("old"))
    session.execute(update(IdempotencyKeyRow).values(created_at=utcnow() - timedelta(days=2)))
    session.commit()
    # Past the 24 h TTL the key is free for a new body.
    response = await client.post(PLANS, json=cheap_plan(top_k=1), headers=key("old"))
    assert response.status_code == 201
    assert "idempotent-replayed" not in response.headers


async def test_deleting_the_plan_forgets_its_keys(client: httpx.AsyncClient, session: Session) -> None:
    created = await client.post(PLANS, json=cheap_plan(), headers=key("del"))
    await client.delete(f"{PLANS}/{created.json()['id']}")
    assert session.scalar(select(func.count()).select_from(IdempotencyKeyRow)) == 0
    again = await client.post(PLANS, json=cheap_plan(), headers=key("del"))
    assert again.status_code == 201 and again.json()["id"] != created.json()["id"]


@pytest.mark.parametrize("value", ["", "x" * 256, "has space", "tab\there", "ünïcode"])
async def test_malformed_keys_are_422(client: httpx.AsyncClient, value: str) -> None:
    headers = {"Idempotency-Key": value.encode("utf-8")}  # raw bytes: clients can send non-ASCII
    problem = assert_problem(
        await client.post(PLANS, json=cheap_plan(), headers=headers), 422, "invalid-request"
    )
    assert problem["errors"][0]["location"] == "header"
