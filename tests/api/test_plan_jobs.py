"""Large plan searches and re-plans as jobs (plan jobs): a re-plan answers 202 and its job stores the plan
a synchronous re-plan stored; a POST /plans beyond the job threshold becomes a job, a small one stays
synchronous; Idempotency-Key; a failed job says why (API, dashboard, CLI). On SQLite and PostgreSQL with
the in-process engine, and on PostgreSQL with procrastinate and a real `fsdp-planner worker`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
import typer
from fastapi import FastAPI
from sqlalchemy import func, select

from api.app import create_app
from api.cli import common as cli_common
from api.db.base import Base, utcnow
from api.db.models import PlanJobRow
from api.schemas.plans import PlanCreate, ReplanCreate
from api.services import replan as replan_service
from api.services.keyed_locks import KeyedLocks
from api.settings import Settings
from tests.api.conftest import assert_problem, cheap_plan, wait_for_plan_job
from tests.api.test_oom_runs import oom_run
from tests.api.test_procrastinate_jobs import (  # noqa: F401  (fixtures)
    Worker,
    api,
    explained,
    new_database,
    query,
    settings_for,
    workers,
)

pytestmark = pytest.mark.anyio
PLANS = "/api/v1/plans"
THRESHOLD = 8


def graph(units: int = 16, *, params: int = 4_000_000, name: str = "traced") -> dict[str, Any]:
    """A traced model of `units` layer-graph units (beyond THRESHOLD: a job)."""
    return {"name": name, "architecture": "layer_graph", "layer_graph": [
        {"name": f"blocks.{i}", "num_params": params + i, "fwd_flops_per_token": 8e6,
         "activation_bytes_per_token": 16384} for i in range(units)
    ]}


@asynccontextmanager
async def running(database_url: str, **overrides: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """An app on the session's database (emptied) with a low job threshold, inside its lifespan."""
    app = create_app(Settings(database_url=database_url, migrate_on_startup=False,
                              job_threshold_units=THRESHOLD, study_search_workers=1, **overrides))
    with app.state.engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(table.delete())
    try:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        ) as client:
            yield app, client
    finally:
        app.state.engine.dispose()


def job_count(app: FastAPI) -> int:
    with app.state.session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(PlanJobRow)) or 0)


async def test_a_replan_is_a_job_that_stores_what_a_synchronous_replan_stored(database_url: str) -> None:
    async with running(database_url) as (app, client):
        plan = (await client.post(PLANS, json=cheap_plan())).json()
        run = (await client.post(f"{PLANS}/{plan['id']}/runs", json=oom_run())).json()
        # What POST /replan answered before it was a job: the service, synchronously.
        with app.state.session_factory() as session:
            before = replan_service.replan(session, plan["id"], ReplanCreate(), locks=KeyedLocks(),
                                           search_pool=app.state.search_pool)
            expected_id, expected_status = before.row.id, before.status_code
        assert expected_status == 201

        response = await client.post(f"{PLANS}/{plan['id']}/replan")
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted["state"] in ("queued", "running") and accepted["kind"] == "replan"
        assert response.headers["location"] == f"/api/v1/plan-jobs/{accepted['id']}"
        job = await wait_for_plan_job(client, accepted["id"])
        # The same inputs, hence the same plan: found stored (200), not searched into a second row.
        assert job["state"] == "succeeded" and job["plan_id"] == expected_id and job["status_code"] == 200
        new = (await client.get(job["plan_url"])).json()
        assert new["replanned_from_plan_id"] == plan["id"] and new["replanned_from_run_id"] == run["id"]
        assert new["peak_memory_gib"] < plan["peak_memory_gib"]
        # The dashboard's job page leads to the plan once the job has succeeded.
        page = await client.get(f"/plan-jobs/{job['id']}")
        assert page.status_code == 303 and page.headers["location"] == f"/plans/{expected_id}?existing=1"


async def test_a_large_layer_graph_is_a_job_and_a_small_plan_stays_synchronous(database_url: str) -> None:
    async with running(database_url) as (app, client):
        small = await client.post(PLANS, json=cheap_plan(model=graph(THRESHOLD)))
        assert small.status_code == 201, small.text  # at the threshold: synchronous, as before
        assert small.headers["location"].endswith(f"{PLANS}/{small.json()['id']}")
        assert job_count(app) == 0

        body = cheap_plan(model=graph(THRESHOLD * 2), name="large")
        response = await client.post(PLANS, json=body)
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted["kind"] == "plan" and accepted["name"] == "large"
        assert accepted["units"] == THRESHOLD * 2
        job = await wait_for_plan_job(client, accepted["id"])
        assert job["state"] == "succeeded" and job["status_code"] == 201, job
        stored = (await client.get(job["plan_url"])).json()
        assert stored["name"] == "large" and len(stored["request"]["model"]["layer_graph"]) == THRESHOLD * 2
        # Planned before: the stored plan, at once (no job), as for any request.
        again = await client.post(PLANS, json=body)
        assert again.status_code == 200 and again.json()["id"] == stored["id"]
        assert job_count(app) == 1
        # Invalid inputs are refused at once, not queued.
        assert_problem(await client.post(PLANS, json=cheap_plan(model=graph(THRESHOLD * 2),
                                                                cluster="1x3xnope")), 422)
        assert job_count(app) == 1


async def test_idempotency_keys_name_one_job_and_refuse_another_body(database_url: str) -> None:
    async with running(database_url) as (app, client):
        body = cheap_plan(model=graph(THRESHOLD * 2))
        first = await client.post(PLANS, json=body, headers={"Idempotency-Key": "big-1"})
        assert first.status_code == 202, first.text
        again = await client.post(PLANS, json=body, headers={"Idempotency-Key": "big-1"})
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
        assert again.headers["idempotent-replayed"] == "true"
        for other in (cheap_plan(model=graph(THRESHOLD * 3)), cheap_plan()):  # larger; small
            assert_problem(await client.post(PLANS, json=other, headers={"Idempotency-Key": "big-1"}), 422,
                           "idempotency-key-reused")
        assert job_count(app) == 1  # nothing stored for the refused bodies
        await wait_for_plan_job(client, first.json()["id"])

        plan = (await client.post(PLANS, json=cheap_plan())).json()
        await client.post(f"{PLANS}/{plan['id']}/runs", json=oom_run())
        replan = f"{PLANS}/{plan['id']}/replan"
        one = await client.post(replan, json={}, headers={"Idempotency-Key": "re-1"})
        two = await client.post(replan, json={}, headers={"Idempotency-Key": "re-1"})
        assert one.status_code == two.status_code == 202 and one.json()["id"] == two.json()["id"]
        assert_problem(await client.post(replan, json={"name": "other"}, headers={"Idempotency-Key": "re-1"}),
                       422, "idempotency-key-reused")
        assert job_count(app) == 2
        assert (await wait_for_plan_job(client, one.json()["id"]))["state"] == "succeeded"


async def test_a_failed_job_says_why_in_the_api_and_on_the_dashboard(database_url: str) -> None:
    # A search deadline no search meets: the job fails with the problem the request would have had.
    async with running(database_url, search_deadline_s=1e-6) as (_app, client):
        response = await client.post(PLANS, json=cheap_plan(model=graph(THRESHOLD * 2)))
        assert response.status_code == 202, response.text
        job = await wait_for_plan_job(client, response.json()["id"])
        assert job["state"] == "failed" and job["plan_id"] is None
        assert job["problem"]["type"] == "urn:fsdp-planner:problem:search-deadline-exceeded"
        assert job["problem"]["status"] == 422 and job["error"] == job["problem"]["detail"]
        page = await client.get(f"/plan-jobs/{job['id']}")
        assert page.status_code == 200 and 'id="plan-job-error"' in page.text
        assert job["error"].split(";")[0][:40] in page.text
        assert_problem(await client.get("/api/v1/plan-jobs/999999"), 404, "plan-job-not-found")


async def test_a_plan_job_left_running_by_a_dead_process_runs_again(database_url: str) -> None:
    async with running(database_url, study_stale_after_s=1.0) as (app, client):
        # As a web process killed mid-search leaves it: running, its heartbeat old, attempt 1.
        body = PlanCreate.model_validate(cheap_plan(model=graph(THRESHOLD * 2)))
        with app.state.session_factory() as session:
            row = PlanJobRow(kind="plan", name="orphan", units=THRESHOLD * 2,
                             body=body.model_dump(mode="json"), state="running", attempts=1,
                             created_at=utcnow(), heartbeat_at=utcnow() - timedelta(hours=1),
                             started_at=utcnow())
            session.add(row)
            session.commit()
            job_id = row.id
        job = await wait_for_plan_job(client, job_id, timeout_s=30)  # the watchdog queues it again
        assert job["state"] == "succeeded" and job["attempts"] == 2, job


class _Server:
    """Answers GET /plan-jobs/5 with the next of `jobs`, then GET /plans/{id} (what `replan` follows)."""

    server = "http://planner.test"

    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.jobs = list(jobs)

    def get(self, path: str, *, not_found: str | None = None) -> dict[str, Any]:
        if path.startswith("/plans/"):
            return {"id": int(path.rsplit("/", 1)[1]), "plan": {}}
        assert path == "/plan-jobs/5" and not_found
        return self.jobs.pop(0)


def _job(state: str, **fields: Any) -> dict[str, Any]:
    return {"id": 5, "kind": "replan", "state": state, **fields}


def test_the_cli_follows_a_plan_job_and_a_failure_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_common, "PLAN_JOB_POLL_S", 0.0)
    server = _Server(_job("running"), _job("succeeded", plan_id=12))
    assert cli_common.is_plan_job(_job("queued")) and not cli_common.is_plan_job({"id": 1, "plan": {}})
    plan = cli_common.plan_answer(server, _job("queued"))  # type: ignore[arg-type]
    assert plan["id"] == 12 and server.jobs == []

    infeasible = {"type": "urn:fsdp-planner:problem:infeasible-plan", "status": 422}
    failing = _Server(_job("failed", error="nothing lighter is left: every configuration",
                           problem=infeasible))
    with pytest.raises(typer.Exit) as exited:
        cli_common.follow_plan_job(failing, _job("running"))  # type: ignore[arg-type]
    assert exited.value.exit_code == cli_common.EXIT_INFEASIBLE
    error = " ".join(capsys.readouterr().err.split())
    assert "re-plan job 5 failed on the server: nothing lighter is left" in error


@pytest.mark.postgres
async def test_procrastinate_workers_run_replans_and_large_plans(
    new_database: Callable[[], str], workers: Callable[[str, str], Worker]  # noqa: F811
) -> None:
    url = new_database()
    settings = settings_for(url).model_copy(update={"job_threshold_units": THRESHOLD})
    async with api(settings) as client:
        plan = (await client.post(PLANS, json=cheap_plan())).json()  # small: the API searches it
        await client.post(f"{PLANS}/{plan['id']}/runs", json=oom_run())
        replan = await client.post(f"{PLANS}/{plan['id']}/replan")
        large = await client.post(PLANS, json=cheap_plan(model=graph(THRESHOLD * 2)))
        assert replan.status_code == large.status_code == 202
        # The API runs no job: they wait in the task engine's `plans` queue for a worker.
        queued = query(url, "SELECT queue_name, status FROM procrastinate.procrastinate_jobs ORDER BY id")
        assert [tuple(row) for row in queued] == [("plans", "todo"), ("plans", "todo")]
        worker = workers(url, "w1")
        with explained(worker):
            replanned = await wait_for_plan_job(client, replan.json()["id"], timeout_s=60)
            planned = await wait_for_plan_job(client, large.json()["id"], timeout_s=60)
            assert replanned["state"] == planned["state"] == "succeeded", (replanned, planned)
            assert replanned["status_code"] == planned["status_code"] == 201
        new = (await client.get(replanned["plan_url"])).json()
        assert new["replanned_from_plan_id"] == plan["id"]
        assert new["peak_memory_gib"] < plan["peak_memory_gib"]
        done = query(url, "SELECT status FROM procrastinate.procrastinate_jobs ORDER BY id")
        assert [row.status for row in done] == ["succeeded", "succeeded"]
    # What the synchronous re-plan stores for the same failure: the plan the worker stored.
    app = create_app(settings)
    try:
        with app.state.session_factory() as session:
            again = replan_service.replan(session, plan["id"], ReplanCreate(), locks=KeyedLocks(),
                                          search_pool=app.state.search_pool)
            assert again.status_code == 200 and again.row.id == replanned["plan_id"]
    finally:
        app.state.search_pool.shutdown()
        app.state.engine.dispose()


@pytest.mark.postgres
async def test_a_worker_killed_mid_plan_job_has_it_retried_and_the_plan_stored_once(
    new_database: Callable[[], str], workers: Callable[[str, str], Worker]  # noqa: F811
) -> None:
    url = new_database()
    settings = settings_for(url).model_copy(update={"job_threshold_units": THRESHOLD})
    maximal = {"model": graph(1024, params=1_000_000, name="maximal"), "cluster": "1x8xH100",
               "training": {"seq_len": 2048, "global_batch_tokens": 2048 * 32}}  # a few seconds' search
    async with api(settings) as client:
        job_id = (await client.post(PLANS, json=maximal)).json()["id"]
        first = workers(url, "w1")
        with explained(first):
            deadline = time.monotonic() + 60
            while (job := (await client.get(f"/api/v1/plan-jobs/{job_id}")).json())["state"] != "running":
                assert job["state"] == "queued" and time.monotonic() < deadline, job
                await anyio.sleep(0.05)
        first.kill()  # mid-search
        second = workers(url, "w2")
        with explained(first, second):
            job = await wait_for_plan_job(client, job_id, timeout_s=90)
            assert job["state"] == "succeeded" and job["attempts"] == 2, job
            jobs = query(url, "SELECT status, attempts FROM procrastinate.procrastinate_jobs")
            assert [tuple(row) for row in jobs] == [("succeeded", 2)]
    assert [tuple(row) for row in query(url, "SELECT id FROM plans")] == [(job["plan_id"],)]
