"""Out-of-memory runs through the runs API, and re-planning around them (POST /plans/{id}/replan)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import assert_problem, cheap_plan, replanned

pytestmark = pytest.mark.anyio
PLANS = "/api/v1/plans"
GIB = 1024**3
MEASURED = {"measured_step_time_s": 1.0, "measured_tokens_per_s_per_gpu": 500.0}


def oom_run(**oom: Any) -> dict[str, Any]:
    """The body `fsdp-planner validate --upload` sends for a run that ran out of memory."""
    details = {"step": 2, "phase": "backward", "requested_bytes": 8 * GIB, "allocated_bytes": 70 * GIB,
               "reserved_bytes": 74 * GIB, "message": "CUDA out of memory. Tried to allocate 8.00 GiB"}
    return {"outcome": "oom", "steps": 1, "oom": {**details, **oom}, "raw": {"rank": 0}}


async def _plan(client: httpx.AsyncClient, **overrides: Any) -> dict[str, Any]:
    response = await client.post(PLANS, json=cheap_plan(**overrides))
    assert response.status_code == 201, response.text
    return response.json()


async def test_an_oom_run_is_stored_without_prediction_errors(client: httpx.AsyncClient) -> None:
    plan = await _plan(client)
    runs = f"{PLANS}/{plan['id']}/runs"
    created = await client.post(runs, json=oom_run())
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["outcome"] == "oom"
    assert run["oom"] == oom_run()["oom"]
    for field in ("measured_step_time_s", "measured_tokens_per_s_per_gpu", "step_time_error_pct",
                  "tokens_per_s_error_pct", "peak_memory_error_pct"):
        assert run[field] is None, field
    assert run["predicted_peak_memory_gib"] == pytest.approx(plan["peak_memory_gib"])
    # Today's body (no outcome) is still a completed run.
    completed = await client.post(runs, json=MEASURED)
    assert completed.status_code == 201 and completed.json()["outcome"] == "completed"
    assert completed.json()["oom"] is None and completed.json()["step_time_error_pct"] is not None
    listed = (await client.get(runs)).json()["items"]
    assert [r["outcome"] for r in listed] == ["completed", "oom"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"outcome": "oom"}, '"oom": {"phase"'),
        ({"measured_step_time_s": 1.0}, "needs measured_tokens_per_s_per_gpu"),
        ({"measured_step_time_s": 1.0, "measured_tokens_per_s_per_gpu": 1.0, "oom": {"phase": "forward"}},
         '"outcome": "oom"'),
        ({"outcome": "exploded", "oom": {"phase": "forward"}}, "completed"),
        ({**oom_run(), "oom": {"phase": "Backward!"}}, "phase"),
        ({**oom_run(), "oom": {"phase": "forward", "requested_bytes": -1}}, "requested_bytes"),
        ({**oom_run(), "oom": {"phase": "forward", "surprise": 1}}, "surprise"),
    ],
)
async def test_inconsistent_runs_are_refused_with_a_clear_message(
    client: httpx.AsyncClient, body: dict[str, Any], says: str
) -> None:
    plan = await _plan(client)
    problem = assert_problem(await client.post(f"{PLANS}/{plan['id']}/runs", json=body), 422)
    assert says in problem["detail"] + str(problem.get("errors")), problem


async def test_replan_after_an_oom_run_avoids_configurations_as_hungry(client: httpx.AsyncClient) -> None:
    plan = await _plan(client)
    run = (await client.post(f"{PLANS}/{plan['id']}/runs", json=oom_run())).json()
    status, new = await replanned(client, plan["id"])  # a plan job (202), followed to its plan
    assert status == 201, new
    assert new["id"] != plan["id"] and new["replanned_from_plan_id"] == plan["id"]
    assert new["replanned_from_run_id"] == run["id"]
    assert new["peak_memory_gib"] < plan["peak_memory_gib"]
    assert new["plan"]["config"] != plan["plan"]["config"]
    assert new["request"]["search"]["max_peak_memory_gib"] == pytest.approx(plan["peak_memory_gib"])
    for alternative in new["plan"]["alternatives"]:
        assert alternative["peak_memory_gib"] < plan["peak_memory_gib"]
    assert new["name"].endswith("(re-planned)")
    # The same failure re-planned again: the stored plan, not a new search.
    status, again = await replanned(client, plan["id"], {"run_id": run["id"]})
    assert status == 200 and again["id"] == new["id"]
    # The source plan is unchanged and plain plans carry no provenance.
    source = (await client.get(f"{PLANS}/{plan['id']}")).json()
    assert source["replanned_from_plan_id"] is None
    assert "max_peak_memory_gib" not in source["request"]["search"]


async def test_replan_without_a_run_uses_the_plans_own_configuration_until_nothing_is_lighter(
    client: httpx.AsyncClient,
) -> None:
    plan = await _plan(client)
    peaks = [plan["peak_memory_gib"]]
    current = plan
    excluded: set[str] = set()
    for _ in range(100):
        status, answer = await replanned(client, current["id"], {})
        if status == 422:
            break
        assert status == 201, answer
        current = answer
        assert current["replanned_from_run_id"] is None
        excluded.update(r["family"] for r in current["plan"]["rejected"] if r["kind"] == "excluded")
        peaks.append(current["peak_memory_gib"])
    else:
        pytest.fail("re-planning never ran out of lighter configurations")
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks) > 2
    # Families that would fit the GPU but not under the ceiling say so ("excluded", not "OOM").
    assert any(f.startswith("no_shard ") and f.endswith(" eager") for f in excluded), excluded
    problem = answer
    assert problem["type"] == "urn:fsdp-planner:problem:infeasible-plan", problem
    assert "nothing lighter is left" in problem["detail"] and problem["max_peak_memory_gib"] == pytest.approx(
        peaks[-1]
    )


async def test_replan_problems(client: httpx.AsyncClient) -> None:
    plan = await _plan(client)
    other = await _plan(client, name="other", training={"seq_len": 128, "global_batch_tokens": 1024})
    foreign = (await client.post(f"{PLANS}/{other['id']}/runs", json=oom_run())).json()
    completed = (await client.post(f"{PLANS}/{plan['id']}/runs", json=MEASURED)).json()
    assert_problem(await client.post(f"{PLANS}/999999/replan"), 404, "plan-not-found")
    problem = assert_problem(
        await client.post(f"{PLANS}/{plan['id']}/replan", json={"run_id": foreign["id"]}), 422, "unknown-run"
    )
    assert f"not a validation run of plan {plan['id']}" in problem["detail"]
    replan = f"{PLANS}/{plan['id']}/replan"
    problem = assert_problem(await client.post(replan, json={"run_id": completed["id"]}), 422, "run-not-oom")
    assert "Leave out run_id" in problem["detail"]
    assert_problem(await client.post(f"{PLANS}/{plan['id']}/replan", json={"run_id": "1"}), 422)
    assert_problem(await client.post(f"{PLANS}/{plan['id']}/replan", json={"nope": 1}), 422)
