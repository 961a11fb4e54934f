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
    assert names == {"plan.json", "fsdp_planner_job.py", "launch.sh", "slurm.sbatch", "README.md"}


async def test_a_model_torchtitan_lacks_is_a_clear_422(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    problem = assert_problem(
        await client.get(f"{PLANS}/{plan['id']}/launcher", params={"target": "torchtitan"}), 422
    )
    assert "registry has no model" in problem["detail"]
