"""What a newcomer tripped over in the service, through the app with a real database: the launch
bundles of one plan download under a name per target, and a request with a training field at the top
level is told where it belongs."""

from __future__ import annotations

import json
import re

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


async def test_the_advice_for_a_model_one_gpu_cannot_hold_names_the_inputs_that_plan(
    client: httpx.AsyncClient,
) -> None:
    """In the request's terms (the command line turns them into options): the cluster, the pinned
    degrees and the batch on which the request plans, and posting them plans."""
    body = {"model": "llama3.1-405b", "cluster": "1x1xH100",
            "training": {"seq_len": 8192, "global_batch_tokens": 65536}}
    refused = await client.post(PLANS, json=body)
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    advice = re.search(r'it plans on \d+ GPUs: cluster "([^"]+)", (.*?) \(the lightest', detail)
    assert advice, detail
    search: dict[str, list[int]] = {}
    training = dict(body["training"])
    for name, value in re.findall(r"([\w.]+) (\[\d+\]|\d+)", advice.group(2)):
        section, field = name.split(".")
        if section == "search":
            search[field] = json.loads(value)
        else:
            training[field] = int(value)
    assert "context_parallel_degrees" in search, detail
    followed = await client.post(PLANS, json={**body, "cluster": advice.group(1), "training": training,
                                              "search": search})
    assert followed.status_code in (200, 201), followed.text
