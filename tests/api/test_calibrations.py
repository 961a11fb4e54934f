"""/calibrations and /plans/{id}/runs: upload, fit, use in plans, validation runs with errors."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import assert_problem, cheap_plan, cpu_profile

pytestmark = pytest.mark.anyio

CALIBRATIONS = "/api/v1/calibrations"
PLANS = "/api/v1/plans"


async def test_upload_stores_the_profile_and_its_fit(client: httpx.AsyncClient) -> None:
    response = await client.post(CALIBRATIONS, json=cpu_profile())
    assert response.status_code == 201, response.text
    body = response.json()
    assert response.headers["location"].endswith(f"{CALIBRATIONS}/{body['id']}")
    assert body["name"] == "cpu box" and body["fingerprint"]["backend"] == "gloo"
    fitted = body["fitted_parameters"]["fp32"]
    catalog = body["fitted_parameters"]["fp32_catalog"]
    # 0.2 GB/s measured over gloo replaces the catalog's guess.
    assert fitted["links"]["intra"]["bandwidth"] == pytest.approx(0.2e9, rel=0.01)
    assert fitted["links"]["intra"]["bandwidth"] != catalog["links"]["intra"]["bandwidth"]
    again = await client.get(f"{CALIBRATIONS}/{body['id']}")
    assert again.status_code == 200 and again.json()["profile"]["gpu"] == "cpu"
    listing = (await client.get(CALIBRATIONS)).json()
    assert [item["id"] for item in listing["items"]] == [body["id"]]


@pytest.mark.parametrize(
    ("device_name", "gpu"),
    [
        ("cpu (x86_64)", "cpu"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ],
)
async def test_without_gpu_the_catalog_gpu_comes_from_the_device_name(
    client: httpx.AsyncClient, device_name: str, gpu: str
) -> None:
    """`gpu` is optional in the schema, so a profile without it is accepted when the device is known."""
    profile = cpu_profile()
    del profile["gpu"]
    profile["fingerprint"] = {**profile["fingerprint"], "device_name": device_name}
    created = await client.post(CALIBRATIONS, json=profile)
    assert created.status_code == 201, created.text
    assert created.json()["profile"]["gpu"] == gpu
    stored = (await client.get(created.headers["location"])).json()
    assert stored["profile"]["gpu"] == gpu and set(stored["fitted_parameters"]) >= {"bf16", "fp32"}


async def test_without_gpu_an_unknown_device_is_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    profile = cpu_profile()
    del profile["gpu"]
    profile["fingerprint"] = {**profile["fingerprint"], "device_name": "NVIDIA RTX 6000 Ada Generation"}
    problem = assert_problem(await client.post(CALIBRATIONS, json=profile), 422, "invalid-calibration")
    assert "'NVIDIA RTX 6000 Ada Generation'" in problem["detail"] and "set `gpu`" in problem["detail"]
    assert problem["errors"][0]["field"] == "gpu"
    assert (await client.get(CALIBRATIONS)).json()["items"] == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpu": "TPUv9"}, "gpu"),
        ({"matmul": [{"m": 1, "n": 1, "k": 1, "dtype": "float32", "seconds": -1}]}, "matmul"),
        ({"fingerprint": {"device_name": "x"}}, "fingerprint"),
        (
            {"collectives": [{"op": "gossip", "group_size": 2, "link": "intra", "bytes": 1, "seconds": 1}]},
            "collectives",
        ),
        ({"schema_version": "9.9"}, "schema_version"),
        ({"usable_memory_bytes": 1e200}, "usable_memory_bytes"),
        ({"extra": True}, "extra"),
    ],
)
async def test_malformed_or_hostile_profiles_are_clear_4xx(
    client: httpx.AsyncClient, overrides: dict, field: str
) -> None:
    problem = assert_problem(await client.post(CALIBRATIONS, json=cpu_profile(**overrides)), 422)
    assert field in problem["detail"] or any(
        field in (e.get("field") or "") for e in problem.get("errors", [])
    )


async def test_too_many_samples_are_refused(client: httpx.AsyncClient) -> None:
    sample = {"bytes": 1024, "seconds": 0.001}
    response = await client.post(CALIBRATIONS, json=cpu_profile(memory_bandwidth=[sample] * 10_001))
    assert response.status_code in (413, 422)


async def test_a_profile_changes_the_plan_and_must_match_the_gpu(client: httpx.AsyncClient) -> None:
    profile_id = (await client.post(CALIBRATIONS, json=cpu_profile())).json()["id"]
    uncalibrated = (await client.post(PLANS, json=cheap_plan())).json()
    calibrated = (await client.post(PLANS, json=cheap_plan(calibration_id=profile_id))).json()
    assert calibrated["plan"]["calibration_id"] == str(profile_id)
    # The profile measured 0.2 GB/s links: communication takes far longer than the catalog's guess.
    assert calibrated["plan"]["prediction"]["comm_s"] > 2 * uncalibrated["plan"]["prediction"]["comm_s"]

    on_h100 = cheap_plan(
        cluster="1x8xH100", calibration_id=profile_id, training={"seq_len": 256, "global_batch_tokens": 4096}
    )
    problem = assert_problem(await client.post(PLANS, json=on_h100), 422, "calibration-mismatch")
    assert "measured on cpu" in problem["detail"] and "H100-SXM-80GB" in problem["detail"]

    in_use = assert_problem(await client.delete(f"{CALIBRATIONS}/{profile_id}"), 409, "calibration-in-use")
    assert "delete those plans first" in in_use["detail"]
    await client.delete(f"{PLANS}/{calibrated['id']}")
    assert (await client.delete(f"{CALIBRATIONS}/{profile_id}")).status_code == 204
    assert_problem(await client.get(f"{CALIBRATIONS}/{profile_id}"), 404, "calibration-not-found")


async def test_validation_runs_record_measured_beside_predicted(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    predicted = plan["plan"]["prediction"]
    measured = {
        "measured_step_time_s": predicted["step_time_s"] * 2,
        "measured_tokens_per_s_per_gpu": predicted["tokens_per_s_per_gpu"] / 2,
        "measured_peak_memory_gib": predicted["peak_memory_gib"],
        "steps": 5,
        "raw": {"device": "cpu", "step_times_s": [1.0, 1.1]},
    }
    runs = f"{PLANS}/{plan['id']}/runs"
    created = await client.post(runs, json=measured)
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["predicted_step_time_s"] == pytest.approx(predicted["step_time_s"])
    assert run["step_time_error_pct"] == pytest.approx(-50.0)  # predicted half the measured time
    assert run["tokens_per_s_error_pct"] == pytest.approx(100.0)
    assert run["peak_memory_error_pct"] == pytest.approx(0.0)
    listed = (await client.get(runs)).json()["items"]
    assert [r["id"] for r in listed] == [run["id"]]

    assert_problem(await client.post(f"{PLANS}/999999/runs", json=measured), 404, "plan-not-found")
    bad = {**measured, "measured_step_time_s": 0}
    assert_problem(await client.post(runs, json=bad), 422)
    # Deleting the plan deletes its runs.
    await client.delete(f"{PLANS}/{plan['id']}")
    assert_problem(await client.get(runs), 404)
