"""Bounded searches: they run in the app's process pool, stop at the configured deadline with a
problem that stores nothing, and never hold up reads or small plans."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.db.models import IdempotencyKeyRow, PlanRow
from api.services import search_pool
from api.services.search_pool import SearchPool
from api.settings import Settings
from planner import precheck
from tests.api.conftest import assert_problem, cheap_plan, distinct_plans
from tests.live_server import running_server

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
DEADLINE_S = 1.0
SYNCHRONOUS_UP_TO = 2048
"""A job threshold above every graph here: large plans are searched in their request, in the pool."""


@pytest.fixture
def settings(database_url: str) -> Settings:
    # Two search processes (one per core of the CI machine) and a short deadline; the large plan is
    # searched in the request, as it is below the job threshold (these tests are the search pool's: the
    # test client may use both processes, where each client's share is one by default, and its requests
    # wait for room however long a loaded machine takes; see test_search_shares.py).
    return Settings(
        database_url=database_url, migrate_on_startup=False, search_deadline_s=DEADLINE_S, search_workers=2,
        job_threshold_units=SYNCHRONOUS_UP_TO, search_share=2, search_share_wait_s=3600,
    )


def distinct_graph(units: int = 1024) -> dict[str, Any]:
    """A traced model of `units` modules, no two alike: nothing repeats, so pricing it takes tens of
    seconds of CPU, far past the deadline."""
    return {
        "name": "all-different",
        "architecture": "layer_graph",
        "layer_graph": [
            {"name": f"layers.{i}", "num_params": 1_000_000 + i, "fwd_flops_per_token": 4e7,
             "activation_bytes_per_token": 4096}
            for i in range(units)
        ],
    }


# About 2.4 s of search CPU time on this 2-core machine (2.4x the deadline): the search leaves most
# of its configurations untimed (their floor shows them beaten), and times the rest group by group.
LARGE = cheap_plan(model=distinct_graph(), cluster="8x8xH100",
                   training={"seq_len": 2048, "global_batch_tokens": 2048 * 1024})


def count(session: Session, table: type) -> int:
    session.expire_all()
    return session.scalar(select(func.count()).select_from(table)) or 0


async def test_a_search_past_the_deadline_is_refused_and_stores_nothing(
    client: httpx.AsyncClient, session: Session
) -> None:
    response = await client.post(PLANS, json=LARGE, headers={"Idempotency-Key": "big-one"})
    problem = assert_problem(response, 422, "search-deadline-exceeded")
    assert problem["time_limit_s"] == DEADLINE_S
    assert f"stopped after {DEADLINE_S:g} s of CPU time, the limit per plan" in problem["detail"]
    assert "merge the 1024 layer-graph units into fewer, larger blocks" in problem["detail"]
    assert problem["errors"][0]["field"] == "search"
    assert count(session, PlanRow) == 0 and count(session, IdempotencyKeyRow) == 0


async def test_reads_and_a_small_plan_answer_while_a_large_search_runs(client: httpx.AsyncClient) -> None:
    stored = await client.post(PLANS, json=cheap_plan())
    assert stored.status_code == 201, stored.text
    finished: list[str] = []

    async def timed(name: str, request: Any) -> httpx.Response:
        response = await request
        finished.append(name)
        return response

    large = asyncio.ensure_future(timed("large", client.post(PLANS, json=LARGE)))
    await asyncio.sleep(0.2)  # the large search is under way in one of the two search processes
    small_body = cheap_plan(training={"seq_len": 128, "global_batch_tokens": 128 * 4})
    small, read, health = await asyncio.gather(
        timed("small", client.post(PLANS, json=small_body)),
        timed("read", client.get(f"{PLANS}/{stored.json()['id']}")),
        timed("health", client.get("/healthz")),
    )
    assert (small.status_code, read.status_code, health.status_code) == (201, 200, 200)
    assert (await large).status_code == 422  # it ran into the deadline
    assert finished[-1] == "large", finished


async def test_reads_answer_while_more_plans_wait_for_a_search_than_there_are_threads(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More waiting plan requests than FastAPI's default thread pool (40) holds threads.
    waiting = 45
    searches_may_finish = threading.Event()
    real = SearchPool.search

    def held(pool: SearchPool, request: Any, *args: Any) -> Any:
        searches_may_finish.wait(timeout=60)
        return real(pool, request, *args)

    monkeypatch.setattr(SearchPool, "search", held)
    posts = [asyncio.ensure_future(client.post(PLANS, json=body)) for body in distinct_plans(waiting)]
    await asyncio.sleep(0.5)  # every planning thread is waiting for a search, the other plans for a thread
    health = await client.get("/healthz")
    listing = await client.get(PLANS)
    assert (health.status_code, listing.status_code) == (200, 200)
    assert not any(post.done() for post in posts)  # the reads did not wait for the searches
    searches_may_finish.set()
    assert {(await post).status_code for post in posts} == {201}


async def test_the_search_runs_in_a_worker_process(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def in_the_request_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the plan was searched in the web process")

    # The workers forked from a server that imported the planner before this patch existed.
    monkeypatch.setattr(search_pool, "make_plan", in_the_request_process)
    response = await client.post(PLANS, json=cheap_plan())
    assert response.status_code == 201, response.text
    assert response.json()["plan"]["config"]["sharding"]


# ---------------------------------------------------------------- batch advice (issue 22: no search work
# in the web process). A batch of partial sequences is refused with batches that plan, which probes
# configurations on other clusters: seconds for a large model, once in a web thread without a deadline.

PARTIAL = cheap_plan(training={"seq_len": 256, "global_batch_tokens": 2000})
# 3.9 s of advice in the web process on this 2-core machine (it bisects clusters up to 32 nodes).
LARGE_PARTIAL = {"model": "llama3.1-405b", "cluster": "1x8xH100",
                 "training": {"seq_len": 1048576, "global_batch_tokens": 3145729}}


def no_advice_here(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("batch advice was looked for in the web process")


async def test_batch_advice_is_looked_for_in_a_worker_process(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers forked from a server that imported the planner before this patch existed.
    monkeypatch.setattr(precheck, "advise", no_advice_here)
    problem = assert_problem(await client.post(PLANS, json=PARTIAL), 422, "unplannable-request")
    assert problem["detail"].startswith(
        "training.global_batch_tokens: 2000 is not a whole number of 256-token sequences"
    )
    assert "use a batch that splits and fits on 1x2xcpu" in problem["detail"]
    assert problem["errors"][0]["field"] == "training.global_batch_tokens"
    # The dashboard form's hint under the batch: a batch that does not split over 3 ranks, then one
    # of partial sequences; both the planner's advice, priced in the pool.
    form = {"model": "llama-debug", "num_nodes": "1", "gpus_per_node": "3", "gpu": "cpu", "seq_len": "256",
            "global_batch_tokens": "1024"}
    hint = await client.post("/plans/new/batch-hint", data=form)
    assert hint.status_code == 200 and "cannot be split evenly over 3 GPUs" in hint.text, hint.text
    assert "e.g. 3 sequences" in hint.text, hint.text
    hint = await client.post("/plans/new/batch-hint", data={**form, "global_batch_tokens": "1000"})
    assert "1000 is not a whole number of 256-token sequences" in hint.text, hint.text


async def test_batch_advice_stops_at_the_search_deadline(client: httpx.AsyncClient, app: Any) -> None:
    app.state.search_pool.deadline_s = 0.2
    started = time.perf_counter()
    problem = assert_problem(await client.post(PLANS, json=LARGE_PARTIAL), 422, "unplannable-request")
    assert time.perf_counter() - started < 3.0  # a worker's start, then 0.2 s of CPU time
    assert problem["detail"] == (
        "training.global_batch_tokens: 3145729 is not a whole number of 1048576-token sequences (the batch "
        "must be a multiple of seq_len); the batches nearest it that split over 1x8xH100-SXM-80GB are 3, "
        "4, 2, 8 sequences, not checked for memory: looking for one that fits stopped after 0.2 s of CPU "
        "time, the limit per plan"
    )


@pytest.mark.timeout(300)  # today's code took minutes, one web thread at a time
async def test_reads_answer_while_twenty_batch_advices_are_looked_for(
    client: httpx.AsyncClient, app: Any
) -> None:
    # Issue 22's goal: GET /plans stays fast while 20 such requests arrive. The advice takes at most
    # the deadline, in the pool's two processes; the web process only waits for them.
    app.state.search_pool.deadline_s = 0.5
    assert (await client.post(PLANS, json=cheap_plan())).status_code == 201
    posts = [asyncio.ensure_future(client.post(PLANS, json=LARGE_PARTIAL)) for _ in range(20)]
    await asyncio.sleep(0.3)  # every request is being validated, its advice queued or looked for
    reads: list[float] = []
    while not all(post.done() for post in posts):
        started = time.perf_counter()
        listing = await client.get(PLANS)
        reads.append(time.perf_counter() - started)
        assert listing.status_code == 200 and len(listing.json()["items"]) == 1
        await asyncio.sleep(0.02)
    # 20 advices of 0.5 s each on 2 processes: seconds of reads. The goal is a 50 ms median; a loaded
    # 2-core CI machine gets some slack (today's code answered in seconds, behind the advice's GIL: its
    # median too). CI once saw one read of 2.3 s on PostgreSQL beside the torch.distributed tests.
    assert len(reads) >= 5, len(reads)
    assert statistics.median(reads) < 0.1 and max(reads) < 3.0, (statistics.median(reads), max(reads))
    for post in posts:
        assert_problem(await post, 422, "unplannable-request")

def children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task").glob("*/children")
    return [int(child) for task in tasks for child in task.read_text().split()]


def descendants(pid: int) -> list[int]:
    return [d for child in children(pid) for d in (child, *descendants(child))]


def forked_workers() -> list[int]:
    """Processes forked by this test process's forkserver: the search pools' workers."""
    return [worker for server in children(os.getpid()) for worker in children(server)]


async def test_a_search_process_that_dies_is_a_503_and_the_pool_recovers(
    client: httpx.AsyncClient, session: Session
) -> None:
    large = asyncio.ensure_future(client.post(PLANS, json=LARGE))
    await asyncio.sleep(0.5)  # searching
    for pid in forked_workers():  # as the kernel's OOM killer would
        os.kill(pid, signal.SIGKILL)
    problem = assert_problem(await large, 503, "search-failed")
    assert "send the request again" in problem["detail"]
    assert count(session, PlanRow) == 0
    again = await client.post(PLANS, json=cheap_plan())
    assert again.status_code == 201, again.text


def test_serve_with_several_workers_searches_in_pools_and_stops_them(
    database_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "FSDP_PLANNER_SEARCH_DEADLINE_S": str(DEADLINE_S),
           "FSDP_PLANNER_JOB_THRESHOLD_UNITS": str(SYNCHRONOUS_UP_TO)}
    with running_server(env=env, log=tmp_path / "serve.log", cwd=tmp_path, args=("--workers", "2")) as url:
        small = httpx.post(f"{url}{PLANS}", json=cheap_plan(), timeout=60)
        assert small.status_code in (200, 201), small.text  # the session's database may hold it already
        assert_problem(httpx.post(f"{url}{PLANS}", json=LARGE, timeout=120), 422, "search-deadline-exceeded")
        assert httpx.get(url + small.headers["location"]).status_code == 200
        # Two web processes, each with its forkserver and at least one search process: a web process
        # starts its pool's first worker in the background, which a loaded machine may not have
        # finished yet (the plans above may all have gone to the other web process).
        deadline = time.monotonic() + 30
        while True:
            processes = descendants(served_by(url))
            forkservers = sum("forkserver" in _cmdline(p) for p in processes)
            if forkservers >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert forkservers >= 4, [_cmdline(p) for p in processes]
    # Stopped with the server (forkservers notice their web process is gone within moments).
    deadline = time.monotonic() + 15
    while (left := [pid for pid in processes if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_search_processes_die_with_a_server_killed_outright(database_url: str, tmp_path: Path) -> None:
    """kill -9 of the server (no shutdown runs) ends its search processes too, mid-search or idle."""
    env = {**os.environ, "DATABASE_URL": database_url, "FSDP_PLANNER_SEARCH_DEADLINE_S": "60",
           "FSDP_PLANNER_SEARCH_WORKERS": "2", "FSDP_PLANNER_JOB_THRESHOLD_UNITS": str(SYNCHRONOUS_UP_TO)}
    with running_server(env=env, log=tmp_path / "serve.log", cwd=tmp_path) as url:
        small = httpx.post(f"{url}{PLANS}", json=cheap_plan(), timeout=60)
        assert small.status_code in (200, 201), small.text
        large = threading.Thread(target=post_ignoring_the_answer, args=(f"{url}{PLANS}", LARGE), daemon=True)
        large.start()
        server = served_by(url)
        deadline = time.monotonic() + 10
        while len(processes := descendants(server)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # the forkserver and both search processes, one of them searching
        assert len(processes) >= 3, processes
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (left := [pid for pid in processes if running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]
        large.join(timeout=10)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_web_processes_stop_with_a_supervisor_killed_outright(database_url: str, tmp_path: Path) -> None:
    """kill -9 of `serve --workers 2`'s supervisor stops its web processes and their search pools."""
    env = {**os.environ, "DATABASE_URL": database_url, "FSDP_PLANNER_SEARCH_WORKERS": "1",
           "FSDP_PLANNER_JOB_THRESHOLD_UNITS": str(SYNCHRONOUS_UP_TO)}
    with running_server(env=env, log=tmp_path / "serve.log", cwd=tmp_path, args=("--workers", "2")) as url:
        assert httpx.post(f"{url}{PLANS}", json=cheap_plan(), timeout=60).status_code in (200, 201)
        supervisor = served_by(url)
        processes = descendants(supervisor)
        web = [p for p in children(supervisor) if "forkserver" not in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(web) >= 2, [Path(f"/proc/{pid}/cmdline").read_text() for pid in processes]
        os.kill(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while (left := [pid for pid in processes if running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/readyz", timeout=2)


def post_ignoring_the_answer(url: str, body: dict[str, Any]) -> None:
    """A request whose server is killed while it waits: only the search it starts matters."""
    with contextlib.suppress(httpx.TransportError):
        httpx.post(url, json=body, timeout=30)


def served_by(url: str) -> int:
    """The pid of the `fsdp-planner serve` child of this process listening at `url`."""
    port = url.rsplit(":", 1)[1]
    return next(pid for pid in children(os.getpid()) if port in Path(f"/proc/{pid}/cmdline").read_text())


def _cmdline(pid: int) -> str:
    """The process's command line ("" once it has gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except FileNotFoundError:
        return ""


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
