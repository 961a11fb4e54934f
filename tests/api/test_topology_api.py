"""POST /plans with a cluster whose NVLink domain spans nodes: the rack spelling and the object's
`scaleup_domain_gpus` plan, store and read back; a domain that splits a node is a 422 naming the field."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import assert_problem

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
TRAINING = {"seq_len": 4096, "global_batch_tokens": 4096 * 288}


async def test_racks_plan_and_read_back_as_nodes_in_domains(client: httpx.AsyncClient) -> None:
    response = await client.post(
        PLANS, json={"model": "llama3-8b", "cluster": "4x72xGB200", "training": TRAINING}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["gpu"], body["world_size"]) == ("GB200", 288)
    cluster = body["request"]["cluster"]
    assert (cluster["num_nodes"], cluster["gpus_per_node"]) == (72, 4)
    assert "scaleup_domain_gpus" not in cluster  # the catalog's NVL72 domain
    same = await client.post(PLANS, json={
        "model": "llama3-8b", "training": TRAINING,
        "cluster": {"num_nodes": 72, "gpus_per_node": 4, "gpu": "GB200"},
    })
    assert same.status_code == 200 and same.json()["id"] == body["id"]  # one plan, one hash
    smaller = await client.post(PLANS, json={
        "model": "llama3-8b", "training": TRAINING,
        "cluster": {"num_nodes": 72, "gpus_per_node": 4, "gpu": "GB200", "scaleup_domain_gpus": 8},
    })
    assert smaller.status_code == 201 and smaller.json()["request"]["cluster"]["scaleup_domain_gpus"] == 8


async def test_a_domain_that_splits_a_node_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post(PLANS, json={
        "model": "llama3-8b", "training": TRAINING,
        "cluster": {"num_nodes": 72, "gpus_per_node": 4, "gpu": "GB200", "scaleup_domain_gpus": 6},
    })
    assert_problem(response, 422)
    assert "scaleup_domain_gpus: 6 is not a whole number of 4-GPU nodes" in response.text
