"""/studies through the real API and database (SQLite and PostgreSQL): create (a job, followed to its end),
list, read, download the plans' bundles, delete; and the clear 422s of bad inputs (before anything is
queued). The jobs themselves (progress, cancel, idempotency, fairness): test_study_jobs.py."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import httpx
import pytest

from tests.api.conftest import assert_problem, cpu_profile, wait_for_study

pytestmark = pytest.mark.anyio

STUDIES = "/api/v1/studies"
PLANS = "/api/v1/plans"

# Cheap: gpt2 on H100s and A100s, four sizes each (one not whole nodes), a few hundred ms in all.
STUDY: dict[str, Any] = {
    "model": "gpt2",
    "token_budget": 10_000_000_000,
    "gpus": [{"gpu": "H100", "price_per_gpu_hour": 2.5}, {"gpu": "A100"}],
    "cluster_sizes": [1, 8, 12, 16],
    "seq_len": 1024,
    "global_batch_tokens": 262_144,
    "deadline_days": 2.0,
}


def study(**overrides: Any) -> dict[str, Any]:
    return {**STUDY, **overrides}


async def planned(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """Submit a study (202) and wait for its job: the succeeded study."""
    response = await client.post(STUDIES, json=body)
    assert response.status_code == 202, response.text
    finished = await wait_for_study(client, response.json()["id"])
    assert finished["state"] == "succeeded", finished
    return finished


async def test_a_study_is_planned_stored_listed_and_its_plans_downloadable(client: httpx.AsyncClient) -> None:
    response = await client.post(STUDIES, json=study(name="gpt2 what-if"))
    assert response.status_code == 202, response.text
    queued = response.json()
    assert response.headers["location"].endswith(f"{STUDIES}/{queued['id']}")
    assert queued["state"] in ("queued", "running") and queued["points"] == []
    created = await wait_for_study(client, queued["id"])
    assert created["state"] == "succeeded" and created["candidates_done"] == 8 and created["error"] is None
    assert created["name"] == "gpt2 what-if" and created["model_name"] == "gpt2"
    assert created["gpus"] == ["H100-SXM-80GB", "A100-80GB"]
    points = created["points"]
    assert [(p["cluster"], p["fits"]) for p in points] == [
        ("1x1xH100-SXM-80GB", True), ("1x8xH100-SXM-80GB", True), ("12xH100-SXM-80GB", False),
        ("2x8xH100-SXM-80GB", True),
        ("1x1xA100-80GB", True), ("1x8xA100-80GB", True), ("12xA100-80GB", False), ("2x8xA100-80GB", True),
    ]
    assert created["num_candidates"] == 8 and created["num_fitting"] == 6
    assert "not a whole number of 8-GPU" in points[2]["reason"] and points[2]["plan_id"] is None
    assert [p["position"] for p in points] == list(range(8))
    fitting = [p for p in points if p["fits"]]
    assert all(p["plan_id"] for p in fitting) and any(p["pareto"] for p in fitting)

    # The picks name positions of fitting points; the deadline is judged point by point.
    assert points[created["fastest"]]["days"] == min(p["days"] for p in fitting)
    assert points[created["cheapest"]]["cost"] == min(p["cost"] for p in fitting)
    in_time = [p for p in fitting if p["days"] <= 2.0]
    assert [p["within_deadline"] for p in fitting] == [p["days"] <= 2.0 for p in fitting]
    if in_time:
        assert points[created["cheapest_within_deadline"]]["cost"] == min(p["cost"] for p in in_time)

    # Stored: the detail reads back the same; the list shows it.
    detail = (await client.get(f"{STUDIES}/{created['id']}")).json()
    assert detail == created
    listed = (await client.get(STUDIES)).json()
    assert [item["id"] for item in listed["items"]] == [created["id"]] and listed["next_cursor"] is None
    assert listed["items"][0]["num_fitting"] == 6

    # Each fitting cluster's plan is an ordinary stored plan with its launchers.
    plans = (await client.get(PLANS, params={"limit": 50})).json()["items"]
    assert {p["id"] for p in plans} == {p["plan_id"] for p in fitting}
    chosen = fitting[1]
    plan = (await client.get(f"{PLANS}/{chosen['plan_id']}")).json()
    assert plan["name"] == f"gpt2 what-if: {chosen['cluster']}"
    assert plan["plan"]["plan_hash"] == chosen["plan_hash"]
    assert plan["plan"]["config"] and plan["world_size"] == chosen["num_gpus"]
    bundle = await client.get(f"{PLANS}/{chosen['plan_id']}/launcher")
    assert bundle.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(bundle.content), mode="r:gz") as archive:
        root = archive.getnames()[0].split("/")[0]
        stored = json.loads(archive.extractfile(f"{root}/plan.json").read())  # type: ignore[union-attr]
    assert stored == plan["plan"]


async def test_days_and_cost_follow_from_the_throughput_and_the_price(client: httpx.AsyncClient) -> None:
    created = (await planned(client, study()))
    for point in (p for p in created["points"] if p["fits"]):
        plan = (await client.get(f"{PLANS}/{point['plan_id']}")).json()["plan"]
        tokens_per_s = plan["prediction"]["tokens_per_s"]
        price = 2.5 if point["gpu"] == "H100-SXM-80GB" else 1.79  # A100: the documented default
        assert point["price_per_gpu_hour"] == price
        assert point["tokens_per_s"] == tokens_per_s
        seconds = 10_000_000_000 / tokens_per_s
        assert point["days"] == pytest.approx(seconds / 86_400, rel=1e-12)
        assert point["gpu_hours"] == pytest.approx(point["num_gpus"] * seconds / 3_600, rel=1e-12)
        assert point["cost"] == pytest.approx(point["gpu_hours"] * price, rel=1e-12)


async def test_studies_share_plans_and_deleting_keeps_what_others_use(client: httpx.AsyncClient) -> None:
    first = (await planned(client, study()))
    second = (await planned(client, study(deadline_days=30.0, name="again")))
    assert second["id"] != first["id"]
    assert [p["plan_id"] for p in second["points"]] == [p["plan_id"] for p in first["points"]]  # deduplicated

    # A plan deleted: the points keep their numbers and lose the link.
    plan_id = first["points"][0]["plan_id"]
    assert (await client.delete(f"{PLANS}/{plan_id}")).status_code == 204
    point = (await client.get(f"{STUDIES}/{first['id']}")).json()["points"][0]
    assert point["plan_id"] is None and point["fits"] and point["cost"] == first["points"][0]["cost"]

    # A study deleted: its plans stay, the other study too.
    assert (await client.delete(f"{STUDIES}/{first['id']}")).status_code == 204
    assert_problem(await client.get(f"{STUDIES}/{first['id']}"), 404, "study-not-found")
    assert_problem(await client.delete(f"{STUDIES}/{first['id']}"), 404, "study-not-found")
    kept = first["points"][1]["plan_id"]
    assert (await client.get(f"{PLANS}/{kept}")).status_code == 200
    assert (await client.get(f"{STUDIES}/{second['id']}")).status_code == 200

    page = (await client.get(STUDIES, params={"limit": 1})).json()
    assert [item["id"] for item in page["items"]] == [second["id"]] and page["next_cursor"] is None


async def test_list_pages_newest_first(client: httpx.AsyncClient) -> None:
    ids = [(await planned(client, study(cluster_sizes=[8], name=f"s{i}")))["id"]
           for i in range(3)]
    first = (await client.get(STUDIES, params={"limit": 2})).json()
    assert [item["id"] for item in first["items"]] == ids[:0:-1]
    rest = (await client.get(STUDIES, params={"limit": 2, "cursor": first["next_cursor"]})).json()
    assert [item["id"] for item in rest["items"]] == [ids[0]] and rest["next_cursor"] is None


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"gpus": []}, "gpus", "at least 1"),
    ({"gpus": [{"gpu": "H100", "price_per_gpu_hour": 0}]}, "gpus.0.price_per_gpu_hour", "greater than 0"),
    ({"gpus": [{"gpu": "H100", "price_per_gpu_hour": -2.5}]}, "gpus.0.price_per_gpu_hour", "greater than 0"),
    ({"gpus": [{"gpu": "Z9"}]}, "gpus.0.gpu", "unknown GPU 'Z9'"),
    ({"token_budget": 10**30}, "token_budget", "less than or equal to 10000000000000000"),
    ({"token_budget": 2**64 + 1}, "token_budget", "less than or equal"),
    ({"token_budget": 1.5e300}, "token_budget", ""),
    ({"cluster_sizes": {"min_gpus": 64, "max_gpus": 8}}, "cluster_sizes", "is empty"),
    ({"cluster_sizes": []}, "cluster_sizes", "at least 1"),
    ({"global_batch_tokens": 1000}, "global_batch_tokens", "not a whole number of 1024-token sequences"),
    ({"model": "gpt-17"}, "model", "unknown model"),
])
async def test_invalid_inputs_get_clear_422s_and_store_nothing(
    client: httpx.AsyncClient, overrides: dict[str, Any], field: str, words: str
) -> None:
    body = assert_problem(await client.post(STUDIES, json=study(**overrides)), 422)
    assert words in body["detail"], body
    assert field in [error["field"] for error in body["errors"]], body
    assert (await client.get(STUDIES)).json()["items"] == []
    assert (await client.get(PLANS)).json()["items"] == []


async def test_a_study_where_nothing_fits_is_stored_with_the_reasons(client: httpx.AsyncClient) -> None:
    created = (await planned(client, study(
        model="llama3-70b", gpus=[{"gpu": "L4"}], cluster_sizes=[1, 2], seq_len=4096,
        global_batch_tokens=8192,
    )))
    assert created["num_fitting"] == 0 and created["fastest"] is None and created["cheapest"] is None
    assert all(p["reason"].startswith("out of memory") for p in created["points"])


CUSTOM_GPU = {"name": "MI300X-like", "memory_gib": 190.0, "peak_bf16_tflops": 1300.0,
              "peak_fp32_tflops": 160.0, "memory_bandwidth_gbps": 5300.0, "intra_node_bandwidth_gbps": 448.0,
              "inter_node_bandwidth_gbps": 50.0}


async def test_a_gpu_type_of_ones_own_is_studied_and_planned(client: httpx.AsyncClient) -> None:
    created = (await planned(client, study(
        gpus=[{"gpu": "MI300X-like", "custom_gpu": CUSTOM_GPU, "price_per_gpu_hour": 2.2}], cluster_sizes=[8],
    )))
    (point,) = created["points"]
    assert point["fits"] and point["gpu"] == "MI300X-like" and point["price_per_gpu_hour"] == 2.2
    plan = (await client.get(f"{PLANS}/{point['plan_id']}")).json()
    assert plan["gpu"] == "MI300X-like" and plan["plan"]["cluster"]["gpu_spec"]["memory_gib"] == 190.0

    # The plan API takes the same datasheet, and gives the study's plan back (same inputs).
    direct = await client.post(PLANS, json={
        "model": "gpt2", "training": {"seq_len": 1024, "global_batch_tokens": 262_144},
        "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "MI300X-like", "custom_gpu": CUSTOM_GPU},
    })
    assert direct.status_code == 200, direct.text
    assert direct.json()["id"] == point["plan_id"]

    # A catalog name for a datasheet of one's own is refused, with the way out.
    clash = await client.post(STUDIES, json=study(
        gpus=[{"gpu": "H100", "custom_gpu": {**CUSTOM_GPU, "name": "H100"}, "price_per_gpu_hour": 2.0}],
    ))
    body = assert_problem(clash, 422, "invalid-request")
    assert "is a catalog GPU" in body["detail"] and "H100-custom" in body["detail"]


async def test_a_gpu_type_is_planned_with_its_stored_calibration(client: httpx.AsyncClient) -> None:
    profile = (await client.post("/api/v1/calibrations", json=cpu_profile())).json()
    body = study(model="llama-debug", cluster_sizes=[2], seq_len=256, global_batch_tokens=2048,
                 gpus=[{"gpu": "cpu", "calibration_id": profile["id"]}])
    calibrated = (await planned(client, body))
    (point,) = calibrated["points"]
    assert point["fits"] and point["calibration_id"] == profile["id"]
    plan = (await client.get(f"{PLANS}/{point['plan_id']}")).json()
    assert plan["calibration_id"] == profile["id"] and plan["plan"]["calibration_id"] == str(profile["id"])

    # The same cluster through POST /plans with the profile is that very plan; without it, another one.
    same = await client.post(PLANS, json={"model": "llama-debug", "cluster": "1x2xcpu",
                                          "training": {"seq_len": 256, "global_batch_tokens": 2048},
                                          "calibration_id": profile["id"]})
    assert same.status_code == 200 and same.json()["id"] == point["plan_id"]
    plain = (await planned(client, {**body, "gpus": [{"gpu": "cpu"}]}))["points"][0]
    assert plain["plan_id"] != point["plan_id"] and plain["tokens_per_s"] != point["tokens_per_s"]

    # A profile that does not exist, or measured on another GPU type, is refused naming the GPU entry.
    missing = assert_problem(await client.post(STUDIES, json={**body, "gpus": [
        {"gpu": "cpu"}, {"gpu": "cpu-custom", "custom_gpu": {**CUSTOM_GPU, "name": "cpu-custom"},
                         "price_per_gpu_hour": 0.1}, {"gpu": "H100", "calibration_id": 999_999}]}), 422,
        "unknown-calibration")
    assert missing["errors"][0]["field"] == "gpus.2.calibration_id"
    other = assert_problem(await client.post(STUDIES, json={**body, "gpus": [
        {"gpu": "H100", "calibration_id": profile["id"]}]}), 422, "calibration-mismatch")
    assert other["errors"][0]["field"] == "gpus.0.calibration_id" and "measured on cpu" in other["detail"]


async def test_a_candidate_may_state_its_scale_up_domain(client: httpx.AsyncClient) -> None:
    # GB200 in NVL36 racks beside the catalog's NVL72: each plan's cluster has its candidate's domain.
    created = await planned(client, study(
        gpus=[{"gpu": "GB200", "price_per_gpu_hour": 5.0},
              {"gpu": "GB200", "price_per_gpu_hour": 5.0, "scaleup_domain_gpus": 36}],
        cluster_sizes=[72], global_batch_tokens=1024 * 288,
    ))
    assert created["gpus"] == ["GB200", "GB200 (domains of 36)"]
    nvl72, nvl36 = created["points"]
    assert (nvl72["cluster"], nvl36["cluster"]) == ("18x4xGB200", "2x36xGB200")
    assert nvl36["fits"] and nvl36["scaleup_domain_gpus"] == 36
    plan = (await client.get(f"{PLANS}/{nvl36['plan_id']}")).json()["plan"]
    assert plan["cluster"]["scaleup_domain_gpus"] == 36
    assert nvl72["plan_id"] != nvl36["plan_id"]

    bad = await client.post(STUDIES, json=study(gpus=[{"gpu": "GB200", "scaleup_domain_gpus": 30,
                                                       "price_per_gpu_hour": 5.0}]))
    body = assert_problem(bad, 422)
    assert "scaleup_domain_gpus: 30 is not a whole number of 4-GPU nodes" in body["detail"], body


async def test_a_study_may_state_the_network_of_its_clusters(client: httpx.AsyncClient) -> None:
    # 16 GPUs are two nodes of H100s: their plans are priced on the stated 200 Gb/s per GPU.
    created = await planned(client, study(gpus=[{"gpu": "H100"}], cluster_sizes=[8, 16],
                                          inter_node_bandwidth_gbps=25.0))
    assert created["request"]["inter_node_bandwidth_gbps"] == 25.0
    one_node, two_nodes = created["points"]
    assert (one_node["num_nodes"], two_nodes["num_nodes"]) == (1, 2) and two_nodes["fits"]
    plan = (await client.get(f"{PLANS}/{two_nodes['plan_id']}")).json()["plan"]
    assert plan["cluster"]["inter_node_bandwidth_gbps"] == 25.0
    assert not any("network" in warning["message"] for warning in plan["warnings"]), plan["warnings"]

    # A study that states none reads and stores as before the field existed: each GPU type's own NIC.
    unstated = await planned(client, study(gpus=[{"gpu": "H100"}], cluster_sizes=[16]))
    assert "inter_node_bandwidth_gbps" not in unstated["request"]
    plan = (await client.get(f"{PLANS}/{unstated['points'][0]['plan_id']}")).json()["plan"]
    assert plan["cluster"]["inter_node_bandwidth_gbps"] is None
    assert any("does not state its network" in warning["message"] for warning in plan["warnings"])

    for bad in (0.0, 1e9, "400G"):
        body = assert_problem(await client.post(STUDIES, json=study(inter_node_bandwidth_gbps=bad)), 422)
        assert "inter_node_bandwidth_gbps" in [error["field"] for error in body["errors"]], body
