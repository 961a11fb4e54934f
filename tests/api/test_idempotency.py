"""Idempotency-Key: a retried POST replays the first response; the key cannot be reused for another body."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from api.db.base import utcnow
from api.db.models import CalibrationProfileRow, IdempotencyKeyRow, PlanRow
from api.services import plans as plan_service
from tests.api.conftest import assert_problem, cheap_plan, cpu_profile

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


def stored(session: Session) -> tuple[list[tuple], list[tuple]]:
    """Every plan (id, hash) and every key (key, fingerprint, plan, status, time): the database's state."""
    session.expire_all()
    plans = session.execute(select(PlanRow.id, PlanRow.plan_hash).order_by(PlanRow.id)).all()
    keys = session.execute(
        select(IdempotencyKeyRow.key, IdempotencyKeyRow.request_fingerprint, IdempotencyKeyRow.plan_id,
               IdempotencyKeyRow.status_code, IdempotencyKeyRow.created_at).order_by(IdempotencyKeyRow.id)
    ).all()
    session.commit()
    return [tuple(p) for p in plans], [tuple(k) for k in keys]


REFUSED = {
    # Each is refused with 422 after (or instead of) a search; none may store a plan or a key.
    "infeasible": (cheap_plan(model="llama3-8b"), "infeasible-plan"),
    "unknown-model": (cheap_plan(model="nope"), "unplannable-request"),
    "unknown-calibration": (cheap_plan(calibration_id=424242), "unknown-calibration"),
    # Data parallelism only: with tp=2 searched, one data-parallel rank takes any batch.
    "indivisible-batch": (cheap_plan(training={"seq_len": 256, "global_batch_tokens": 256 * 3},
                                     search={"tensor_parallel_degrees": [1]}), None),
    "key-reused": (cheap_plan(top_k=1), "idempotency-key-reused"),
}


@pytest.mark.parametrize("case", REFUSED)
async def test_a_refused_request_stores_nothing(
    client: httpx.AsyncClient, session: Session, case: str
) -> None:
    # A stored plan with its key, and an expired key (which a successful request would purge).
    assert (await client.post(PLANS, json=cheap_plan(), headers=key("key-reused"))).status_code == 201
    assert (await client.post(PLANS, json=cheap_plan(top_k=2), headers=key("stale"))).status_code == 201
    session.execute(
        update(IdempotencyKeyRow).where(IdempotencyKeyRow.key == "stale")
        .values(created_at=utcnow() - timedelta(days=2))
    )
    session.commit()
    before = stored(session)
    body, slug = REFUSED[case]
    assert_problem(await client.post(PLANS, json=body, headers=key(case)), 422, slug)
    assert stored(session) == before
    if case != "key-reused":  # the key stays free for a request that succeeds
        assert (await client.post(PLANS, json=cheap_plan(top_k=3), headers=key(case))).status_code == 201


async def test_a_calibration_deleted_while_planning_stores_nothing(
    client: httpx.AsyncClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile goes while the search runs: the foreign key refuses the plan, and the key with it."""
    profile_id = (await client.post("/api/v1/calibrations", json=cpu_profile())).json()["id"]
    real = plan_service.search

    def search_then_delete_the_profile(*args: Any, **kwargs: Any) -> Any:
        plan = real(*args, **kwargs)
        with Session(session.get_bind()) as other:
            other.execute(delete(CalibrationProfileRow).where(CalibrationProfileRow.id == profile_id))
            other.commit()
        return plan

    monkeypatch.setattr(plan_service, "search", search_then_delete_the_profile)
    before = stored(session)
    problem = assert_problem(
        await client.post(PLANS, json=cheap_plan(calibration_id=profile_id), headers=key("gone")),
        422, "unknown-calibration",
    )
    assert "deleted while planning" in problem["detail"]
    assert stored(session) == before == ([], [])


async def test_a_plan_deleted_before_its_key_is_stored_is_stored_again(
    client: httpx.AsyncClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Identical inputs were planned before, but the plan is deleted between the lookup and the write:
    the key must not point at nothing, so the found plan is stored again with it."""
    first = (await client.post(PLANS, json=cheap_plan())).json()
    real = plan_service.find

    def find_then_delete(db: Session, digest: str) -> PlanRow | None:
        row = real(db, digest)
        with Session(session.get_bind()) as other:
            other.execute(delete(PlanRow).where(PlanRow.plan_hash == digest))
            other.commit()
        return row

    monkeypatch.setattr(plan_service, "find", find_then_delete)
    again = await client.post(PLANS, json=cheap_plan(), headers=key("after-delete"))
    assert again.status_code == 201 and again.json()["id"] != first["id"]
    assert again.json()["plan"] == first["plan"]
    monkeypatch.undo()
    plans, keys = stored(session)
    assert [plan_id for plan_id, _ in plans] == [again.json()["id"]]
    assert [(k[0], k[2], k[3]) for k in keys] == [("after-delete", again.json()["id"], 201)]
