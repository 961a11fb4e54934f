"""What a newcomer tripped over in the service, through the app with a real database: the launch
bundles of one plan download under a name per target, and a request with a training field at the top
level is told where it belongs."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
TARGETS = ("torchrun", "slurm", "k8s", "skypilot", "all")


async def test_each_launcher_target_downloads_under_its_own_name(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    names = {}
    for target in TARGETS:
        response = await client.get(f"{PLANS}/{plan['id']}/launcher", params={"target": target})
        assert response.status_code == 200, response.text
        names[target] = response.headers["content-disposition"].split('filename="')[1].rstrip('"')
    assert len(set(names.values())) == len(TARGETS), names
    for target in TARGETS[:-1]:
        assert names[target].endswith(f"-{target}.tar.gz"), names


async def test_a_training_field_at_the_top_level_is_pointed_to_training(client: httpx.AsyncClient) -> None:
    body = cheap_plan()
    training = dict(body["training"])
    seq_len = training.pop("seq_len")
    response = await client.post(PLANS, json={**body, "seq_len": seq_len, "training": training})
    assert response.status_code == 422, response.text
    problem = response.json()
    assert 'unknown field "seq_len": did you mean "training.seq_len"?' in problem["detail"], problem
    assert '"training": {"seq_len": 4096' in problem["detail"]  # the example shows where it goes
