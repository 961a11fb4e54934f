"""Concurrent POSTs on real worker threads: dedup holds under races, nothing is lost, the loop stays free."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.app import create_app
from api.db.models import IdempotencyKeyRow, PlanRow
from api.services.search_pool import SearchPool
from api.settings import Settings
from tests.api.conftest import cheap_plan, distinct_plans

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
# A narrow search space keeps each plan around 10 ms, so hundreds of them stay quick on two cores.
NARROW = {"shardings": ["full_shard"], "compile": [True], "checkpointing": ["none"]}


def count(session: Session, table: type) -> int:
    session.expire_all()
    return session.scalar(select(func.count()).select_from(table)) or 0


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts planner searches by model name (the real planner still runs, in the search pool)."""
    counter: Counter[str] = Counter()
    lock = threading.Lock()
    real = SearchPool.search

    def counting(pool: SearchPool, request: Any, *args: Any) -> Any:
        with lock:
            counter[request.model.name] += 1
        return real(pool, request, *args)

    monkeypatch.setattr(SearchPool, "search", counting)
    return counter


async def test_50_identical_posts_store_one_plan_and_search_once(
    client: httpx.AsyncClient, session: Session, searches: Counter[str]
) -> None:
    body = cheap_plan(search=NARROW)
    responses = await asyncio.gather(*(client.post(PLANS, json=body) for _ in range(50)))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 1, 200: 49}, statuses
    assert len({r.json()["id"] for r in responses}) == 1
    assert count(session, PlanRow) == 1
    assert searches["llama-debug"] == 1  # the 49 others waited for the first search


async def test_racing_processes_store_one_plan(
    settings: Settings, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two app instances (as two server processes: no shared locks) search the same input at once."""
    both_searched = threading.Barrier(2, timeout=30)
    real = SearchPool.search

    def search_then_wait(pool: SearchPool, request: Any, *args: Any) -> Any:
        plan = real(pool, request, *args)
        both_searched.wait()  # neither inserts before both have missed the lookup
        return plan

    monkeypatch.setattr(SearchPool, "search", search_then_wait)
    apps = [create_app(settings), create_app(settings)]
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://t") for a in apps]
    try:
        body = cheap_plan(search=NARROW)
        responses = await asyncio.gather(*(c.post(PLANS, json=body) for c in clients))
    finally:
        for c, a in zip(clients, apps, strict=True):
            await c.aclose()
            a.state.search_pool.shutdown()
            a.state.engine.dispose()
    assert sorted(r.status_code for r in responses) == [200, 201]  # the unique constraint decided
    assert responses[0].json()["id"] == responses[1].json()["id"]
    assert count(session, PlanRow) == 1


async def test_200_distinct_posts_are_all_stored(client: httpx.AsyncClient, session: Session) -> None:
    bodies = [{**body, "search": NARROW} for body in distinct_plans(200)]
    responses = await asyncio.gather(*(client.post(PLANS, json=body) for body in bodies))
    assert Counter(r.status_code for r in responses) == {201: 200}, [r.text for r in responses][:3]
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 200
    assert count(session, PlanRow) == 200
    stored = {row.id: row.request["training"] for row in session.scalars(select(PlanRow))}
    for body, response in zip(bodies, responses, strict=True):
        training = stored[response.json()["id"]]
        assert (training["seq_len"], training["global_batch_tokens"]) == (
            body["training"]["seq_len"],
            body["training"]["global_batch_tokens"],
        )


async def test_concurrent_retries_with_one_idempotency_key(
    client: httpx.AsyncClient, session: Session
) -> None:
    body = cheap_plan(search=NARROW)
    responses = await asyncio.gather(
        *(client.post(PLANS, json=body, headers={"Idempotency-Key": "same"}) for _ in range(20))
    )
    assert {r.status_code for r in responses} <= {200, 201}
    assert len({r.json()["id"] for r in responses}) == 1
    assert count(session, PlanRow) == 1 and count(session, IdempotencyKeyRow) == 1


async def test_a_long_search_does_not_block_the_event_loop(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = SearchPool.search

    def slow(pool: SearchPool, request: Any, *args: Any) -> Any:
        time.sleep(1.0)  # blocks its thread; were it on the event loop, nothing else would run
        return real(pool, request, *args)

    monkeypatch.setattr(SearchPool, "search", slow)
    finished: dict[str, float] = {}

    async def timed(name: str, request: Any) -> httpx.Response:
        response = await request
        finished[name] = time.perf_counter()
        return response

    start = time.perf_counter()
    post = asyncio.ensure_future(timed("post", client.post(PLANS, json=cheap_plan(search=NARROW))))
    await asyncio.sleep(0.1)
    health = await timed("health", client.get("/healthz"))
    listing = await timed("list", client.get(PLANS))
    assert (health.status_code, listing.status_code) == (200, 200)
    assert (await post).status_code == 201
    assert finished["health"] - start < 0.8 and finished["list"] < finished["post"]
