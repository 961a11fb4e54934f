"""`GET /metrics` (issue 41 item 4): Prometheus series for requests per route template, plans, searches,
the job queue and job durations; off by setting; a read like the others; correct across `serve
--workers N` (prometheus_client's multiprocess mode)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from api.app import create_app
from api.db.base import utcnow
from api.db.models import PlanJobRow
from api.keys import create_key
from api.settings import Settings
from tests.api.conftest import assert_problem, cheap_plan, wait_for_plan_job
from tests.api.test_oom_runs import oom_run
from tests.api.test_plan_jobs import THRESHOLD, graph
from tests.api.test_procrastinate_jobs import (  # noqa: F401  (fixtures)
    Worker,
    api,
    explained,
    new_database,
    settings_for,
    workers,
)
from tests.live_server import free_port, running_server

pytestmark = pytest.mark.anyio
PLANS = "/api/v1/plans"
METRICS = "/metrics"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of a scrape, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scrape: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a series not there yet (a counter that has not moved)."""
    return scrape.get((name, frozenset(labels.items())), 0.0)


def in_process(app: FastAPI) -> httpx.AsyncClient:
    """A client of `app` without its lifespan (nothing runs jobs)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


async def scrape(client: httpx.AsyncClient, headers: Mapping[str, str] | None = None) -> Samples:
    response = await client.get(METRICS, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version="), response.headers
    assert response.headers["cache-control"] == "no-store"
    return samples(response.text)


async def test_a_plan_moves_the_request_plan_and_search_series(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    created = await client.post(PLANS, json=cheap_plan())
    assert created.status_code == 201, created.text
    again = await client.post(PLANS, json=cheap_plan())
    assert again.status_code == 200, again.text
    plan_id = created.json()["id"]
    assert (await client.get(f"{PLANS}/{plan_id}")).status_code == 200
    assert (await client.get(f"{PLANS}/999999999")).status_code == 404
    refused = await client.post(PLANS, json=cheap_plan(model="no-such-model"))
    assert refused.status_code == 422, refused.text
    assert (await client.get("/no/such/path/42")).status_code == 404
    after = await scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "fsdp_planner_http_requests_total"
    # Per route template, never per raw path: the plan's id is not in any label.
    assert moved(requests, method="POST", route=PLANS, status="2xx") == 2
    assert moved(requests, method="POST", route=PLANS, status="4xx") == 1
    assert moved(requests, method="GET", route=f"{PLANS}/{{plan_id}}", status="2xx") == 1
    assert moved(requests, method="GET", route=f"{PLANS}/{{plan_id}}", status="4xx") == 1
    assert moved(requests, method="GET", route="<unmatched>", status="4xx") == 1
    assert moved(requests, method="GET", route=METRICS, status="2xx") == 1  # the first scrape
    routes = {dict(labels)["route"] for _, labels in after if "route" in dict(labels)}
    assert not any(str(plan_id) in route.split("/") or "/no/such" in route for route in routes), routes
    duration = "fsdp_planner_http_request_duration_seconds"
    assert moved(f"{duration}_count", method="POST", route=PLANS, status="2xx") == 2
    assert moved(f"{duration}_sum", method="POST", route=PLANS, status="2xx") > 0
    assert moved(f"{duration}_bucket", method="POST", route=PLANS, status="2xx", le="+Inf") == 2

    assert moved("fsdp_planner_plans_total", kind="plan", outcome="new") == 1
    assert moved("fsdp_planner_plans_total", kind="plan", outcome="cached") == 1
    assert moved("fsdp_planner_plans_total", kind="plan", outcome="refused") == 1
    # One search: the cached request found the stored plan, the refused one never got to search.
    assert moved("fsdp_planner_plan_search_duration_seconds_count", outcome="planned") == 1
    assert moved("fsdp_planner_plan_search_duration_seconds_sum", outcome="planned") > 0

    for kind in ("study", "plan_job"):
        for state in ("queued", "running"):
            assert ("fsdp_planner_jobs", frozenset({("kind", kind), ("state", state)})) in after
    assert value(after, "fsdp_planner_database_up") == 1


async def test_an_idempotent_replay_is_counted_as_replayed(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    for _ in range(2):
        response = await client.post(PLANS, json=cheap_plan(), headers={"Idempotency-Key": "metrics-1"})
        assert response.status_code == 201, response.text
    after = await scrape(client)
    for outcome, times in (("new", 1), ("replayed", 1)):
        assert (value(after, "fsdp_planner_plans_total", kind="plan", outcome=outcome)
                - value(before, "fsdp_planner_plans_total", kind="plan", outcome=outcome)) == times


async def test_the_job_queue_is_counted_in_the_database(app: FastAPI, session: Session) -> None:
    """Queued and running jobs are read at scrape time (no lifespan here: nothing runs them)."""
    for state in ("queued", "queued", "running", "succeeded"):
        session.add(PlanJobRow(kind="plan", name="big", units=1000, body={}, state=state, attempts=0,
                               created_at=utcnow()))
    session.commit()
    async with in_process(app) as client:
        after = await scrape(client)
    assert value(after, "fsdp_planner_jobs", kind="plan_job", state="queued") == 2
    assert value(after, "fsdp_planner_jobs", kind="plan_job", state="running") == 1
    assert value(after, "fsdp_planner_jobs", kind="study", state="queued") == 0


async def test_a_plan_job_is_timed_when_it_ends(database_url: str) -> None:
    from tests.api.test_plan_jobs import running

    async with running(database_url) as (_, client):
        before = await scrape(client)
        accepted = await client.post(PLANS, json=cheap_plan(model=graph(THRESHOLD * 2)))
        assert accepted.status_code == 202, accepted.text
        job = await wait_for_plan_job(client, accepted.json()["id"])
        assert job["state"] == "succeeded", job
        after = await scrape(client)
    count = "fsdp_planner_job_duration_seconds_count"
    assert (value(after, count, kind="plan_job", state="succeeded")
            - value(before, count, kind="plan_job", state="succeeded")) == 1
    assert value(after, "fsdp_planner_job_duration_seconds_sum", kind="plan_job", state="succeeded") > 0
    # The job stored its plan through the same code as POST /plans: counted once, as new.
    assert (value(after, "fsdp_planner_plans_total", kind="plan", outcome="new")
            - value(before, "fsdp_planner_plans_total", kind="plan", outcome="new")) == 1


async def test_openmetrics_when_the_scraper_asks_for_it(client: httpx.AsyncClient) -> None:
    response = await client.get(METRICS, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


@pytest.mark.parametrize("method", ["HEAD", "POST", "PUT", "PATCH", "DELETE"])
async def test_other_methods_are_a_405_problem(client: httpx.AsyncClient, method: str) -> None:
    response = await client.request(method, METRICS)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == "GET, OPTIONS"
    if method != "HEAD":
        assert_problem(response, 405)
    else:
        assert response.headers["content-type"] == "application/problem+json"


async def test_options_and_cross_site_gets_are_answered(client: httpx.AsyncClient) -> None:
    options = await client.options(METRICS)
    assert options.status_code == 204 and options.headers["allow"] == "GET, OPTIONS"
    # A read: the cross-site check (state-changing requests only) leaves it alone.
    cross = await client.get(METRICS, headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.test"})
    assert cross.status_code == 200


async def test_metrics_off_is_a_404(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"metrics": False}))
    try:
        async with in_process(app) as client:
            assert_problem(await client.get(METRICS), 404)
    finally:
        app.state.engine.dispose()


def test_metrics_off_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_PLANNER_METRICS", "false")
    assert Settings().metrics is False


async def test_a_read_like_the_others(settings: Settings, session: Session) -> None:
    """Open while reads are open (keys or not); with `require_key_for_reads`, a key like every GET."""
    issued = create_key(session, "prometheus")
    try:
        for require_key, headers, status in ((False, {}, 200), (True, {}, 401),
                                             (True, {"Authorization": f"Bearer {issued.key}"}, 200)):
            app = create_app(settings.model_copy(update={"require_key_for_reads": require_key}))
            try:
                async with in_process(app) as client:
                    response = await client.get(METRICS, headers=headers)
            finally:
                app.state.engine.dispose()
            assert response.status_code == status, (require_key, response.text)
            if status != 200:
                assert_problem(response, status)
    finally:  # a key left behind would lock out the live servers of later tests
        session.delete(issued.row)
        session.commit()


def test_serve_with_several_workers_counts_every_process(
    database_url: str, app: FastAPI, tmp_path: Path
) -> None:
    """`serve --workers 2`: whichever web process answers the scrape, it counts the requests of both
    (prometheus_client's multiprocess mode, in the operator's PROMETHEUS_MULTIPROC_DIR here, whose files
    of an earlier run are removed first). `app` empties the database first (no API key is left)."""
    metrics_dir = tmp_path / "metrics"
    env = {**os.environ, "DATABASE_URL": database_url, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"an earlier run's counts")

    def writers() -> set[str]:
        return {path.stem.rsplit("_", 1)[-1] for path in metrics_dir.glob("*.db")}

    healthz = 0
    with running_server(env=env, log=tmp_path / "serve.log", cwd=tmp_path, args=("--workers", "2")) as url:
        assert "1" not in writers()
        # A new connection each: the processes share the listening socket, whichever accepts first serves.
        while healthz < 20 or (len(writers()) < 2 and healthz < 400):
            with httpx.Client(base_url=url, timeout=60) as one:
                assert one.get("/healthz").status_code == 200
            healthz += 1
        assert len(writers()) == 2, (healthz, sorted(metrics_dir.iterdir()))  # both processes counted some
        with httpx.Client(base_url=url, timeout=60) as client:
            created = client.post(PLANS, json=cheap_plan(training={"seq_len": 128,
                                                                   "global_batch_tokens": 1024}))
            assert created.status_code in (200, 201), created.text
            scrapes = []
            for _ in range(6):
                with httpx.Client(base_url=url, timeout=60) as one:
                    scrapes.append(samples(one.get(METRICS).text))
    for scraped in scrapes:
        assert value(scraped, "fsdp_planner_http_requests_total", method="GET", route="/healthz",
                     status="2xx") == healthz
        assert sum(value(scraped, "fsdp_planner_plans_total", kind="plan", outcome=outcome)
                   for outcome in ("new", "cached")) == 1
        assert value(scraped, "fsdp_planner_database_up") == 1


@pytest.mark.postgres
async def test_a_procrastinate_worker_serves_the_metrics_of_the_jobs_it_runs(
    new_database: Callable[[], str], workers: Callable[..., Worker]  # noqa: F811
) -> None:
    """With the procrastinate engine the jobs run in `fsdp-planner worker`: `--metrics-port` serves their
    durations, plans and searches; the web's `/metrics` counts them queued (from the database)."""
    url = new_database()
    settings = settings_for(url).model_copy(update={"job_threshold_units": THRESHOLD})
    async with api(settings) as client:
        plan = (await client.post(PLANS, json=cheap_plan())).json()  # small: the API searches it
        await client.post(f"{PLANS}/{plan['id']}/runs", json=oom_run())
        replan = await client.post(f"{PLANS}/{plan['id']}/replan")
        large = await client.post(PLANS, json=cheap_plan(model=graph(THRESHOLD * 2)))
        assert replan.status_code == large.status_code == 202
        assert value(await scrape(client), "fsdp_planner_jobs", kind="plan_job", state="queued") == 2
        port = free_port()
        worker = workers(url, "w1", args=("--metrics-port", str(port)))
        with explained(worker):
            for job in (replan, large):
                done = await wait_for_plan_job(client, job.json()["id"], timeout_s=120)
                assert done["state"] == "succeeded", done
            # The worker's endpoint starts before it takes jobs: it answers by now.
            deadline = time.monotonic() + 30
            while True:
                try:
                    scraped = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, worker.output()
                    time.sleep(0.2)
        web = await scrape(client)
    count = "fsdp_planner_job_duration_seconds_count"
    assert value(scraped, count, kind="plan_job", state="succeeded") == 2
    assert value(scraped, "fsdp_planner_plans_total", kind="plan", outcome="new") == 1
    assert value(scraped, "fsdp_planner_plans_total", kind="replan", outcome="new") == 1
    assert value(scraped, "fsdp_planner_plan_search_duration_seconds_count", outcome="planned") == 2
    assert value(web, "fsdp_planner_jobs", kind="plan_job", state="queued") == 0
