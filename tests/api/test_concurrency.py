"""Concurrent POSTs on real worker threads: dedup holds under races, nothing is lost, the loop stays free."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
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
from tests.live_server import running_server

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
    client: httpx.AsyncClient, session: Session, searches: Counter[str]
) -> None:
    body = cheap_plan(search=NARROW)
    responses = await asyncio.gather(
        *(client.post(PLANS, json=body, headers={"Idempotency-Key": "same"}) for _ in range(20))
    )
    # One stored the plan; the 19 others replay its response, status included.
    assert Counter(r.status_code for r in responses) == {201: 20}
    assert Counter(r.headers.get("idempotent-replayed") for r in responses) == {"true": 19, None: 1}
    assert len({r.json()["id"] for r in responses}) == 1
    assert count(session, PlanRow) == 1 and count(session, IdempotencyKeyRow) == 1
    assert searches["llama-debug"] == 1


async def test_one_key_with_50_bodies_stores_one_plan(
    client: httpx.AsyncClient, session: Session, searches: Counter[str]
) -> None:
    bodies = [{**body, "search": NARROW} for body in distinct_plans(50)]
    responses = await asyncio.gather(
        *(client.post(PLANS, json=body, headers={"Idempotency-Key": "one"}) for body in bodies)
    )
    assert Counter(r.status_code for r in responses) == {201: 1, 422: 49}
    assert {r.json()["type"] for r in responses if r.status_code == 422} == {
        "urn:fsdp-planner:problem:idempotency-key-reused"
    }
    assert count(session, PlanRow) == 1 and count(session, IdempotencyKeyRow) == 1
    (winner,) = [body for body, r in zip(bodies, responses, strict=True) if r.status_code == 201]
    training = session.scalar(select(PlanRow.request))["training"]
    assert (training["seq_len"], training["global_batch_tokens"]) == (
        winner["training"]["seq_len"], winner["training"]["global_batch_tokens"]
    )
    assert searches["llama-debug"] == 1  # the others waited for the key's answer instead of searching


class TwoServers:
    """Two app instances on one database, as two server processes are: no locks in common, each its own
    connection pool. `race` makes each server's first search wait until the other's has finished, so
    that both have found the key free and neither has written when they store."""

    def __init__(self, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
        self.apps = [create_app(settings), create_app(settings)]
        self.clients = [
            httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://t") for a in self.apps
        ]
        both_searched = threading.Barrier(2, timeout=30)
        first_two = iter(range(2))
        lock = threading.Lock()
        real = SearchPool.search

        # Wraps the service's one search step, whatever it takes (it may hand the search to a pool).
        def search_then_wait(*args: Any, **kwargs: Any) -> Any:
            plan = real(*args, **kwargs)
            with lock:
                waits = next(first_two, None) is not None
            if waits:
                both_searched.wait()
            return plan

        monkeypatch.setattr(SearchPool, "search", search_then_wait)

    async def post(self, bodies: list[dict[str, Any]], key: str) -> list[httpx.Response]:
        """POST the bodies with one key, alternating between the two servers, all at once."""
        return await asyncio.gather(*(
            self.clients[i % 2].post(PLANS, json=body, headers={"Idempotency-Key": key})
            for i, body in enumerate(bodies)
        ))

    async def close(self) -> None:
        for client, app in zip(self.clients, self.apps, strict=True):
            await client.aclose()
            app.state.search_pool.shutdown()
            app.state.engine.dispose()


@pytest.fixture
async def two_servers(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TwoServers]:
    servers = TwoServers(settings, monkeypatch)
    yield servers
    await servers.close()


async def test_one_key_with_50_bodies_on_two_servers_stores_one_plan(
    two_servers: TwoServers, session: Session
) -> None:
    bodies = [{**body, "search": NARROW} for body in distinct_plans(50)]
    responses = await two_servers.post(bodies, "one")
    assert Counter(r.status_code for r in responses) == {201: 1, 422: 49}, [r.text for r in responses][:3]
    assert count(session, PlanRow) == 1 and count(session, IdempotencyKeyRow) == 1
    (created,) = [r for r in responses if r.status_code == 201]
    assert session.scalar(select(PlanRow.id)) == created.json()["id"]


async def test_one_key_with_one_body_on_two_servers_replays(
    two_servers: TwoServers, session: Session
) -> None:
    responses = await two_servers.post([cheap_plan(search=NARROW)] * 2, "retry")
    assert [r.status_code for r in responses] == [201, 201]
    assert responses[0].json() == responses[1].json()
    assert sorted(r.headers.get("idempotent-replayed", "") for r in responses) == ["", "true"]
    assert count(session, PlanRow) == 1 and count(session, IdempotencyKeyRow) == 1


async def test_one_key_with_50_bodies_on_two_worker_processes_stores_one_plan(
    database_url: str, session: Session, tmp_path: Path
) -> None:
    """The real thing: `fsdp-planner serve --workers 2`, two processes sharing one database."""
    bodies = [{**body, "search": NARROW} for body in distinct_plans(50)]
    env = {**os.environ, "DATABASE_URL": database_url}
    with running_server(env=env, log=tmp_path / "serve.log", cwd=tmp_path, args=("--workers", "2")) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            responses = await asyncio.gather(
                *(client.post(PLANS, json=body, headers={"Idempotency-Key": "one"}) for body in bodies)
            )
    assert Counter(r.status_code for r in responses) == {201: 1, 422: 49}, [r.text for r in responses][:3]
    assert count(session, PlanRow) == 1 and count(session, IdempotencyKeyRow) == 1


async def test_a_long_search_does_not_block_the_event_loop(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = SearchPool.search

    def slow(pool: SearchPool, request: Any, *args: Any) -> Any:
        time.sleep(2.0)  # blocks its thread; were it on the event loop, nothing else would run
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
    # Order, not a time limit: on a busy host /healthz may take a second, but were the search on the
    # event loop, neither answer could come before the search's 2 s had passed and the POST answered.
    assert finished["health"] < finished["post"] and finished["list"] < finished["post"]
    assert finished["post"] - start >= 2.0
