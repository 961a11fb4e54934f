"""Measured values are bounded at the edge (planner/bounds.py), and everything computed from what is
accepted (error percentages, fits, plans, pages) stays finite: issue 12, found items 1 and 2."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from planner.bounds import all_finite
from tests.api.conftest import CHEAP_PLAN, assert_problem, cheap_plan, cpu_profile
from tests.extreme_values import EXTREME_RUNS, extreme_profile

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
CALIBRATIONS = "/api/v1/calibrations"
RUN = {"measured_step_time_s": 1.0, "measured_tokens_per_s_per_gpu": 1000.0}


async def plan_id(client: httpx.AsyncClient) -> int:
    response = await client.post(PLANS, json=CHEAP_PLAN)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.parametrize(
    ("field", "value", "advice"),
    [
        ("measured_step_time_s", 5e-324, "between 1e-06 and 1e+06"),  # issue 12: /accuracy became a 500
        ("measured_step_time_s", 0.0, "between 1e-06 and 1e+06"),
        ("measured_step_time_s", -1.0, "between 1e-06 and 1e+06"),
        ("measured_step_time_s", 2e6, "in ms is off by 1000x"),
        ("measured_step_time_s", "1e999", "between 1e-06 and 1e+06"),  # JSON overflowing to infinity
        ("measured_tokens_per_s_per_gpu", 1e12, "per GPU, not summed over the cluster"),
        ("measured_peak_memory_gib", 0.0, "GiB per device"),
        ("measured_peak_memory_gib", 80 * 2**30, "a value in bytes"),
    ],
)
async def test_implausible_run_measurements_are_refused_with_the_range(
    client: httpx.AsyncClient, field: str, value: Any, advice: str
) -> None:
    runs = f"{PLANS}/{await plan_id(client)}/runs"
    body = json.dumps({**RUN, field: 0}).replace(f'"{field}": 0', f'"{field}": {value}')
    problem = assert_problem(
        await client.post(runs, content=body, headers={"content-type": "application/json"}),
        422, "invalid-request",
    )
    assert [e["field"] for e in problem["errors"]] == [field]
    assert "not physically plausible" in problem["detail"] and advice in problem["detail"]
    assert (await client.get(runs)).json()["items"] == []  # nothing stored


@pytest.mark.parametrize(
    ("mutate", "field", "advice"),
    [
        # issue 12: 1e200 s was a ZeroDivisionError in the line fit (1/y^2 underflowed to 0.0).
        (lambda p: p["collectives"][0].update(seconds=1e200), "collectives.0.seconds", "between 1e-07"),
        (lambda p: p["collectives"][0].update(seconds=1e-9), "collectives.0.seconds", "between 1e-07"),
        (lambda p: p["collectives"][3].update(bytes=10**12, seconds=1e-3), "collectives.3",
         "is 5e+14 B/s, faster than 1e+14 B/s that any link reaches"),
        (lambda p: p["matmul"][3].update(m=10**5, n=10**5, k=10**5, seconds=1e-3), "matmul.3",
         "faster than 1e+17 FLOP/s"),
        (lambda p: p["memory_bandwidth"][0].update(bytes=10**12, seconds=1e-3), "memory_bandwidth.0",
         "faster than 1e+14 B/s that any memory reaches"),
        (lambda p: p["matmul"][0].update(seconds=float("nan")), "matmul.0.seconds", "plausible"),
    ],
)
async def test_impossible_calibration_timings_are_refused(
    client: httpx.AsyncClient, mutate: Any, field: str, advice: str
) -> None:
    profile = cpu_profile()
    mutate(profile)
    body = json.dumps(profile).replace("NaN", "1e999")  # JSON has no NaN; an overflowing literal is inf
    problem = assert_problem(
        await client.post(CALIBRATIONS, content=body, headers={"content-type": "application/json"}),
        422, "invalid-request",
    )
    assert [e["field"] for e in problem["errors"]] == [field]
    assert advice in problem["detail"]
    assert (await client.get(CALIBRATIONS)).json()["items"] == []


async def test_runs_at_the_bounds_store_finite_errors(client: httpx.AsyncClient) -> None:
    runs = f"{PLANS}/{await plan_id(client)}/runs"
    for body in EXTREME_RUNS:
        response = await client.post(runs, json=body)
        assert response.status_code == 201, response.text
        run = response.json()
        for name in ("step_time_error_pct", "tokens_per_s_error_pct"):
            assert isinstance(run[name], float) and math.isfinite(run[name]), run
    listed = await client.get(runs)
    assert listed.status_code == 200 and len(listed.json()["items"]) == len(EXTREME_RUNS)
    assert all_finite(listed.json())


async def test_a_profile_at_the_bounds_fits_and_plans(client: httpx.AsyncClient) -> None:
    created = await client.post(CALIBRATIONS, json=extreme_profile())
    assert created.status_code == 201, created.text
    fitted = created.json()["fitted_parameters"]
    assert all_finite(fitted)
    # A fitted link never beats the physical bound, whatever slope the samples gave.
    assert fitted["fp32"]["links"]["intra"]["bandwidth"] <= 100e12
    planned = await client.post(PLANS, json=cheap_plan(calibration_id=created.json()["id"]))
    assert planned.status_code == 201, planned.text
    assert all_finite(planned.json())

    # Usable memory of one byte: nothing fits, which is an answer (422), not a failure.
    tiny = await client.post(
        CALIBRATIONS, json=extreme_profile(name="no memory", usable_memory_bytes=1, device_memory_bytes=2**50)
    )
    assert tiny.status_code == 201, tiny.text
    assert_problem(await client.post(PLANS, json=cheap_plan(calibration_id=tiny.json()["id"])), 422)


async def test_the_openapi_schema_states_the_bounds(client: httpx.AsyncClient) -> None:
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    step = schemas["RunCreate"]["properties"]["measured_step_time_s"]["anyOf"][0]
    assert (step["minimum"], step["maximum"]) == (1e-6, 1e6)
    seconds = schemas["CollectiveSample"]["properties"]["seconds"]
    assert (seconds["minimum"], seconds["maximum"]) == (1e-7, 1e6)
    # Error percentages can be null (an OOM run, a run without a memory measurement).
    out = schemas["RunOut"]["properties"]
    for name in ("step_time_error_pct", "tokens_per_s_error_pct", "peak_memory_error_pct"):
        assert {"type": "null"} in out[name]["anyOf"], out[name]


@pytest.mark.parametrize(
    ("layers", "field", "advice"),
    [
        (65, "steps.1.num_layers", "less than or equal to 64"),  # fitting time grows with the depth
        (5, "steps.1.num_layers", "keeps at most the model's own 4 blocks, not 5"),  # llama-debug: 4
    ],
)
async def test_timed_steps_deeper_than_the_fit_prices_are_refused(
    client: httpx.AsyncClient, layers: int, field: str, advice: str
) -> None:
    profile = extreme_profile()
    profile["steps"][1]["num_layers"] = layers
    problem = assert_problem(await client.post(CALIBRATIONS, json=profile), 422, "invalid-request")
    assert advice in problem["detail"], problem["detail"]
    assert [e["field"] for e in problem["errors"]] == [field]


async def test_nul_characters_in_a_run_are_refused_never_a_500(client: httpx.AsyncClient) -> None:
    # PostgreSQL text and jsonb cannot hold NUL: found by schemathesis as a 500 on PostgreSQL only.
    runs = f"{PLANS}/{await plan_id(client)}/runs"
    refused = (({"log": ["a", {"c": "\u0000"}]}, "raw.log.1.c"), ({"log\u0000": 1}, "raw.log\\u0000"))
    for raw, field in refused:
        problem = assert_problem(await client.post(runs, json={**RUN, "raw": raw}), 422, "invalid-request")
        assert [e["field"] for e in problem["errors"]] == [field]
    stored = await client.post(runs, json={**RUN, "raw": {"log": ["a", {"c": "b"}]}})
    assert stored.status_code == 201, stored.text
    oom = {"outcome": "oom", "oom": {"phase": "backward", "message": "out of memory\u0000"}}
    problem = assert_problem(await client.post(runs, json=oom), 422, "invalid-request")
    assert [e["field"] for e in problem["errors"]] == ["oom.message"]
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    assert_problem(await client.post(runs, json={**RUN, "raw": {"deep": deep}}), 422)
    assert len((await client.get(runs)).json()["items"]) == 1
