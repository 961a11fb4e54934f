"""Fixtures of the API suite: every test runs on SQLite and on the real PostgreSQL at 127.0.0.1:5432.

Each backend gets one fresh database per test session (PostgreSQL: a uniquely named database, dropped at
the end), migrated once; tables are emptied before each test.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from api.app import create_app
from api.db import migrate
from api.db.base import Base
from api.db.session import create_db_engine
from api.settings import Settings

PG_ADMIN_URL = os.environ.get(
    "FSDP_PLANNER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
# CI sets it (.ci/run): an unreachable PostgreSQL then fails the PostgreSQL tests instead of skipping them.
REQUIRE_POSTGRES = os.environ.get("FSDP_PLANNER_REQUIRE_POSTGRES", "") not in ("", "0")
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]

# A small, cheap plan: llama-debug on two CPU ranks, a few tens of milliseconds to search.
CHEAP_PLAN: dict[str, Any] = {
    "model": "llama-debug",
    "cluster": "1x2xcpu",
    "training": {"seq_len": 256, "global_batch_tokens": 2048},
}


def cpu_profile(**overrides: Any) -> dict[str, Any]:
    """A small but real CalibrationProfile of two CPU ranks (slow links, so plans visibly change)."""
    sizes = (64, 128, 256, 512)
    matmul = [{"m": s, "n": s, "k": s, "dtype": "float32", "seconds": 2 * s**3 / 40e9 + 2e-5} for s in sizes]
    collectives = [
        {"op": op, "group_size": 2, "link": "intra", "bytes": size,
         "seconds": (2 if op == "all_reduce" else 1) * (3e-4 + size / 2 / 0.2e9)}
        for op in ("all_gather", "reduce_scatter", "all_reduce")
        for size in (1 << 12, 1 << 16, 1 << 20, 1 << 24)
    ]
    profile = {
        "name": "cpu box", "gpu": "cpu",
        "fingerprint": {"device_name": "cpu", "device_count": 2, "gpus_per_node": 2, "backend": "gloo",
                        "torch_version": "2.13.0"},
        "matmul": matmul, "memory_bandwidth": [{"bytes": 1 << 27, "seconds": 0.01}],
        "collectives": collectives, "overlap_contention": 0.5,
    }
    return {**profile, **overrides}


def cheap_plan(**overrides: Any) -> dict[str, Any]:
    """CHEAP_PLAN with top-level keys replaced."""
    return {**CHEAP_PLAN, **overrides}


def distinct_plans(count: int) -> list[dict[str, Any]]:
    """`count` cheap requests that all hash differently (sequence length x global batch)."""
    bodies = []
    for seq_len in (64, 128, 256, 512, 1024):
        for sequences in range(2, 2 * (count // 5 + 2), 2):
            bodies.append(
                cheap_plan(training={"seq_len": seq_len, "global_batch_tokens": seq_len * sequences})
            )
    return bodies[:count]


@pytest.fixture(scope="session")
def database_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], str]]:
    """Makes fresh, empty databases (`factory(backend) -> url`), dropped when the session ends."""
    created: list[str] = []
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})

    def make(backend: str) -> str:
        if backend == "sqlite":
            return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'fsdp-planner.sqlite3'}"
        name = f"fsdp_planner_test_{os.getpid()}_{secrets.token_hex(4)}"
        try:
            with admin.connect() as connection:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
        except OperationalError as exc:
            unreachable = exc
        else:
            created.append(name)
            return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
        missing = (f"PostgreSQL at {make_url(PG_ADMIN_URL).render_as_string()} is unreachable "
                   f"({unreachable.orig or unreachable}); start it or set FSDP_PLANNER_TEST_POSTGRES_URL")
        if REQUIRE_POSTGRES:
            pytest.fail(f"{missing} (FSDP_PLANNER_REQUIRE_POSTGRES is set: the PostgreSQL and procrastinate "
                        "tests must run, not skip)", pytrace=False)
        pytest.skip(missing)

    yield make
    if created:
        with admin.connect() as connection:
            for name in created:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def database_url(backend: str, database_factory: Callable[[str], str]) -> str:
    """The session's database for `backend`, migrated to head."""
    url = database_factory(backend)
    engine = create_db_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, migrate_on_startup=False)


def empty_tables(app: FastAPI, *, keep: tuple[str, ...] = ()) -> None:
    """Deletes every row of the app's database, but those of the tables named in `keep`."""
    with app.state.engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            if table.name not in keep:
                connection.execute(table.delete())


@pytest.fixture
def app(settings: Settings) -> Iterator[FastAPI]:
    app = create_app(settings)
    empty_tables(app)
    yield app
    app.state.jobs.shutdown()  # started by a study when a test ran no lifespan
    app.state.plan_jobs.shutdown()  # started by a plan job when a test ran no lifespan
    app.state.search_pool.shutdown()  # started by a search when a test ran no lifespan
    app.state.engine.dispose()


@pytest.fixture
def session(app: FastAPI) -> Iterator[Session]:
    """A session on the app's database, for arranging rows and checking what was stored."""
    with app.state.session_factory() as session:
        yield session


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client calling the app in process, inside its lifespan (the search pool runs); sync
    endpoints run in real worker threads."""
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://testserver"
    ) as client:
        yield client


FINAL_STUDY_STATES = ("succeeded", "failed", "cancelled")


async def wait_for_study(
    client: httpx.AsyncClient, study_id: int, *, states: tuple[str, ...] = FINAL_STUDY_STATES,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Poll GET /studies/{id} until its job is in one of `states`; the study then."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = await client.get(f"/api/v1/studies/{study_id}")
        assert response.status_code == 200, response.text
        study = response.json()
        if study["state"] in states:
            return study
        assert time.monotonic() < deadline, f"study {study_id} still {study['state']} after {timeout_s} s"
        await anyio.sleep(0.05)


async def wait_for_plan_job(
    client: httpx.AsyncClient, job_id: int, *, timeout_s: float = 120.0
) -> dict[str, Any]:
    """Poll GET /plan-jobs/{id} until the job has succeeded or failed; the job then."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = await client.get(f"/api/v1/plan-jobs/{job_id}")
        assert response.status_code == 200, response.text
        job = response.json()
        if job["state"] in ("succeeded", "failed"):
            return job
        assert time.monotonic() < deadline, f"plan job {job_id} still {job['state']} after {timeout_s} s"
        await anyio.sleep(0.05)


async def replanned(
    client: httpx.AsyncClient, plan_id: int, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """POST /plans/{id}/replan (202, a plan job), followed to its end: what the re-plan answered
    synchronously before, (201 or 200, the plan) or (the problem's status, the problem)."""
    response = await client.post(f"/api/v1/plans/{plan_id}/replan", json=body)
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"].endswith(f"/api/v1/plan-jobs/{job['id']}")
    assert job["kind"] == "replan" and job["source_plan_id"] == plan_id
    job = await wait_for_plan_job(client, job["id"])
    if job["state"] == "failed":
        assert job["problem"] is not None, job
        return job["problem"]["status"], job["problem"]
    plan = await client.get(job["plan_url"])
    assert plan.status_code == 200, plan.text
    return job["status_code"], plan.json()


def assert_problem(response: httpx.Response, status: int, slug: str | None = None) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status (and type); returns its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json", response.headers
    body = response.json()
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and len(body["detail"]) > 10
    assert "Traceback" not in response.text
    if slug is not None:
        assert body["type"] == f"urn:fsdp-planner:problem:{slug}", body
    return body
