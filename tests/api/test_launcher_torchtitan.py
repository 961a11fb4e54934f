"""GET /plans/{id}/launcher?target=torchtitan: the plan as a torchtitan job, or a 422 saying why not."""

from __future__ import annotations

import io
import tarfile

import httpx
import pytest

from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"


async def test_a_llama3_plan_downloads_as_a_torchtitan_job(client: httpx.AsyncClient) -> None:
    body = cheap_plan(
        model="llama3-8b", cluster="1x8xh100", training={"seq_len": 8192, "global_batch_tokens": 8192 * 64},
    )
    created = await client.post(PLANS, json=body)
    assert created.status_code in (200, 201), created.text
    response = await client.get(f"{PLANS}/{created.json()['id']}/launcher", params={"target": "torchtitan"})
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        names = {m.name.split("/", 1)[1] for m in archive.getmembers()}
    runs = {"launch.sh", "slurm.sbatch", "k8s.yaml", "k8s-pytorchjob.yaml", "README.md", "plan.json"}
    assert names == {"fsdp_planner_job.py", *runs}
    legacy = await client.get(
        f"{PLANS}/{created.json()['id']}/launcher",
        params={"target": "torchtitan", "torchtitan_version": "0.2"},
    )
    assert legacy.status_code == 200, legacy.text
    with tarfile.open(fileobj=io.BytesIO(legacy.content), mode="r:gz") as archive:
        names = {m.name.split("/", 1)[1] for m in archive.getmembers()}
    assert names == {"fsdp_planner_job.toml", *runs}


async def test_a_model_torchtitan_lacks_is_a_clear_422(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    problem = assert_problem(
        await client.get(f"{PLANS}/{plan['id']}/launcher", params={"target": "torchtitan"}), 422
    )
    assert "registry has no model" in problem["detail"]
