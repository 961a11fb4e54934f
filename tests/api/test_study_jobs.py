"""Studies as jobs, in process (the embedded default) on SQLite and PostgreSQL: the lifecycle with its
progress, Idempotency-Key, cancel and delete while running, a failed job's reason, a restart that loses
no queued study, a study whose process was killed run again once (and one whose process lives left to
it), and fairness (a small POST /plans answered promptly while a large study runs)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text, update

from api.app import create_app
from api.db.base import utcnow
from api.db.models import StudyRow
from api.schemas.studies import StudyCreate
from api.services import studies as study_service
from api.services.keyed_locks import KeyedLocks
from api.settings import Settings
from tests.api.conftest import CHEAP_PLAN, assert_problem, cpu_profile, wait_for_study

pytestmark = pytest.mark.anyio

STUDIES = "/api/v1/studies"
PLANS = "/api/v1/plans"

STALE_AFTER_S = 4.0
SMALL: dict[str, Any] = {
    "model": "gpt2", "token_budget": 10_000_000_000, "gpus": [{"gpu": "H100"}], "cluster_sizes": [1, 8, 12],
    "seq_len": 1024, "global_batch_tokens": 262_144,
}
# Large: llama3-8b on 128 sizes of H100 clusters, searched by one process (tens of seconds): it is
# still running whenever a test looks, and every test cancels or deletes it.
LARGE: dict[str, Any] = {
    "model": "llama3-8b", "token_budget": 10**12, "gpus": [{"gpu": "H100"}],
    "cluster_sizes": {"min_gpus": 16, "max_gpus": 2048, "progression": "step", "step": 16},
    "seq_len": 8192, "global_batch_tokens": 4 * 1024 * 1024,
}


@pytest.fixture
def settings(database_url: str) -> Settings:
    # One study at a time, searched by one process: a second study waits queued behind the first.
    return Settings(database_url=database_url, migrate_on_startup=False, study_jobs=1, study_search_workers=1,
                    study_stale_after_s=STALE_AFTER_S)


async def submit(client: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    response = await client.post(STUDIES, json=body, headers=headers)
    assert response.status_code == 202, response.text
    return response


async def running(client: httpx.AsyncClient, study_id: int, done: int = 1) -> dict[str, Any]:
    """Wait until the study runs with at least `done` candidates searched."""
    while True:
        study = await wait_for_study(client, study_id, states=("running", "succeeded", "failed", "cancelled"))
        assert study["state"] == "running", study
        if study["candidates_done"] >= done:
            return study
        await anyio.sleep(0.05)


async def test_a_study_is_queued_runs_with_progress_and_succeeds(client: httpx.AsyncClient) -> None:
    response = await submit(client, SMALL)
    queued = response.json()
    assert queued["state"] in ("queued", "running") and queued["num_candidates"] == 3
    assert queued["points"] == [] and queued["fastest"] is None and queued["error"] is None
    assert response.headers["location"].endswith(f"{STUDIES}/{queued['id']}")
    done = await wait_for_study(client, queued["id"])
    assert done["state"] == "succeeded" and done["candidates_done"] == done["num_candidates"] == 3
    assert done["num_fitting"] == 2 and len(done["points"]) == 3 and done["best_so_far"] is None
    assert done["started_at"] and done["finished_at"] and done["finished_at"] >= done["started_at"]
    listed = (await client.get(STUDIES)).json()["items"]
    assert [(item["id"], item["state"]) for item in listed] == [(done["id"], "succeeded")]


async def test_progress_shows_done_fitting_and_the_best_so_far_then_cancel_stops_it(
    client: httpx.AsyncClient,
) -> None:
    study_id = (await submit(client, LARGE)).json()["id"]
    first = await running(client, study_id, done=2)
    later = await running(client, study_id, done=first["candidates_done"] + 1)
    assert 0 < first["candidates_done"] < later["candidates_done"] < later["num_candidates"] == 128
    assert later["num_fitting"] >= 1 and later["best_so_far"]["fits"] and later["best_so_far"]["cost"] > 0
    assert later["points"] == []

    cancelled = await client.post(f"{STUDIES}/{study_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    await anyio.sleep(1.0)  # the job notices at its next progress write and stores nothing
    after = (await client.get(f"{STUDIES}/{study_id}")).json()
    assert after["state"] == "cancelled" and after["points"] == []
    assert (await client.get(PLANS)).json()["items"] == []
    assert (await client.post(f"{STUDIES}/{study_id}/cancel")).status_code == 200  # again: fine

    # A finished study cannot be cancelled; a missing one is a 404.
    small = (await wait_for_study(client, (await submit(client, SMALL)).json()["id"]))
    assert small["state"] == "succeeded"
    body = assert_problem(await client.post(f"{STUDIES}/{small['id']}/cancel"), 409, "study-finished")
    assert "has succeeded already" in body["detail"]
    assert_problem(await client.post(f"{STUDIES}/999999/cancel"), 404, "study-not-found")


async def test_a_queued_study_waits_its_turn_and_deleting_a_running_one_stops_it(
    client: httpx.AsyncClient,
) -> None:
    large = (await submit(client, LARGE)).json()["id"]
    await running(client, large)
    small = (await submit(client, SMALL)).json()["id"]
    assert (await client.get(f"{STUDIES}/{small}")).json()["state"] == "queued"  # one job thread
    assert (await client.delete(f"{STUDIES}/{large}")).status_code == 204
    finished = await wait_for_study(client, small)
    assert finished["state"] == "succeeded"
    assert_problem(await client.get(f"{STUDIES}/{large}"), 404, "study-not-found")
    # Only the small study's plans were stored.
    plan_ids = {p["plan_id"] for p in finished["points"] if p["fits"]}
    assert {p["id"] for p in (await client.get(PLANS)).json()["items"]} == plan_ids


async def test_idempotency_key_returns_the_same_study_and_refuses_another_body(
    client: httpx.AsyncClient,
) -> None:
    first = await submit(client, SMALL, **{"Idempotency-Key": "study-1"})
    again = await submit(client, SMALL, **{"Idempotency-Key": "study-1"})
    assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["location"] == first.headers["location"]
    other = await client.post(STUDIES, json={**SMALL, "cluster_sizes": [8]},
                              headers={"Idempotency-Key": "study-1"})
    assert_problem(other, 422, "idempotency-key-reused")
    finished = await wait_for_study(client, first.json()["id"])
    replayed = await submit(client, SMALL, **{"Idempotency-Key": "study-1"})
    assert replayed.json() == finished  # after the job too: the same study, finished
    assert len((await client.get(STUDIES)).json()["items"]) == 1
    # Another key is another study; a bad body with a new key stores nothing and leaves the key free.
    assert (await submit(client, SMALL, **{"Idempotency-Key": "study-2"})).json()["id"] != finished["id"]
    bad = await client.post(STUDIES, json={**SMALL, "gpus": []}, headers={"Idempotency-Key": "study-3"})
    assert_problem(bad, 422, "invalid-request")
    fresh = await submit(client, SMALL, **{"Idempotency-Key": "study-3"})
    assert "idempotent-replayed" not in fresh.headers


async def test_a_failed_job_says_why(client: httpx.AsyncClient) -> None:
    profile = (await client.post("/api/v1/calibrations", json=cpu_profile())).json()
    large = (await submit(client, LARGE)).json()["id"]
    await running(client, large)
    calibrated = (await submit(client, {
        "model": "llama-debug", "token_budget": 10**9, "cluster_sizes": [2], "seq_len": 256,
        "global_batch_tokens": 2048, "gpus": [{"gpu": "cpu", "calibration_id": profile["id"]}],
    })).json()["id"]
    # The profile is deleted while the study waits: its job fails, saying what to do.
    assert (await client.delete(f"/api/v1/calibrations/{profile['id']}")).status_code == 204
    assert (await client.post(f"{STUDIES}/{large}/cancel")).status_code == 200
    failed = await wait_for_study(client, calibrated)
    assert failed["state"] == "failed" and failed["points"] == [] and failed["finished_at"]
    assert f"calibration profile {profile['id']} does not exist" in failed["error"]


async def test_a_restart_loses_no_queued_or_running_study(app: FastAPI, settings: Settings) -> None:
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://testserver"
    ) as client:
        large = (await submit(client, LARGE)).json()["id"]
        await running(client, large)
        small = (await submit(client, SMALL)).json()["id"]
    # Stopped: the running study went back to the queue, the queued one stayed there.
    with app.state.session_factory() as session:
        states = dict(session.execute(text("SELECT id, state FROM studies")).all())
    assert states == {large: "queued", small: "queued"}

    restarted = create_app(settings)
    try:
        async with restarted.router.lifespan_context(restarted), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=restarted), base_url="http://testserver"
        ) as client:
            await running(client, large)  # picked up again at start
            assert (await client.post(f"{STUDIES}/{large}/cancel")).status_code == 200
            assert (await wait_for_study(client, small))["state"] == "succeeded"
    finally:
        restarted.state.engine.dispose()


async def test_a_small_plan_is_answered_promptly_while_a_large_study_runs(client: httpx.AsyncClient) -> None:
    large = (await submit(client, LARGE)).json()["id"]
    await running(client, large)
    started = time.monotonic()
    response = await client.post(PLANS, json=CHEAP_PLAN)
    latency = time.monotonic() - started
    assert response.status_code == 201, response.text
    study = (await client.get(f"{STUDIES}/{large}")).json()
    assert study["state"] == "running"  # answered while the study runs, not after it
    # The plan searches in the request pool, never behind the study's queued candidates (its own pool);
    # the bound is loose for a loaded 2-core machine: the study alone takes tens of seconds.
    assert latency < 5.0, f"a small plan took {latency:.2f} s while a study ran"
    print(f"small POST /plans during a 128-candidate study: {latency * 1000:.0f} ms")
    assert (await client.post(f"{STUDIES}/{large}/cancel")).status_code == 200


def _stored_as_running(app: FastAPI, body: dict[str, Any], *, silent_for_s: float) -> int:
    """A study that a process (not this one) claimed and runs, last heard of `silent_for_s` ago."""
    with app.state.session_factory() as session:
        study_id = study_service.submit_study(session, StudyCreate.model_validate(body), locks=KeyedLocks(),
                                              max_model_layers=1024).study_id
        heard = utcnow() - timedelta(seconds=silent_for_s)
        session.execute(update(StudyRow).where(StudyRow.id == study_id).values(
            state="running", attempts=1, started_at=heard, heartbeat_at=heard, candidates_done=1))
        session.commit()
    return study_id


async def test_a_study_whose_process_was_killed_runs_again_once(app: FastAPI) -> None:
    orphan = _stored_as_running(app, SMALL, silent_for_s=3600)  # its process was killed an hour ago
    alive = _stored_as_running(app, LARGE, silent_for_s=0)  # another process runs it and beats
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        # At start, the study of a live process is left to it...
        other = (await client.get(f"{STUDIES}/{alive}")).json()
        assert other["state"] == "running" and other["attempts"] == 1
        done = await wait_for_study(client, orphan)
        assert done["state"] == "succeeded" and done["attempts"] == 2
        assert len(done["points"]) == done["num_candidates"] == 3  # stored once
        stored = {p["id"] for p in (await client.get(PLANS)).json()["items"]}
        assert stored == {p["plan_id"] for p in done["points"] if p["fits"]}
        # ... until it falls silent for longer than the timeout (nothing beats for it here): then it is
        # queued again and run here.
        await anyio.sleep(STALE_AFTER_S + 1)
        taken = await running(client, alive)
        assert taken["attempts"] == 2
        assert (await client.post(f"{STUDIES}/{alive}/cancel")).status_code == 200
