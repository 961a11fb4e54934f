"""GET /plans/{id}/launcher on the clusters teams buy now: NVL72 racks (whole, part of one, tp groups over
a domain's nodes), AMD Instinct (dense and expert-parallel) and the GPU resource of either vendor, for
every target and archive format. Each answer is a bundle or a 422 that names the query field and says
what to use instead; none is a server error."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from tests.api.conftest import assert_problem

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
TARGETS = ("torchrun", "slurm", "k8s", "skypilot", "all", "torchtitan")
REQUESTS: dict[str, dict[str, Any]] = {
    # tp 16 over four nodes of 4 in domains of 64 (16 of each rack's 18 nodes).
    "racks tp16": {"model": "llama2-7b", "cluster": "2x64xGB200",
                   "training": {"seq_len": 2048, "global_batch_tokens": 4194304},
                   "search": {"tensor_parallel_degrees": [16]}},
    # 16 nodes of a rack: one domain of 64 GPUs.
    "part of a rack": {"model": "llama3-8b", "cluster": "16x4xGB200",
                       "training": {"seq_len": 2048, "global_batch_tokens": 4194304},
                       "search": {"tensor_parallel_degrees": [4]}},
    "MI300X ep8": {"model": "qwen3-30b-a3b", "cluster": "2x8xMI300X",
                   "training": {"seq_len": 4096, "global_batch_tokens": 1048576},
                   "search": {"expert_parallel_degrees": [8]}},
}


@pytest.mark.parametrize("name", REQUESTS)
async def test_every_target_answers_a_bundle_or_says_why_not(client: httpx.AsyncClient, name: str) -> None:
    planned = await client.post(PLANS, json=REQUESTS[name])
    assert planned.status_code == 201, planned.text
    launcher = f"{PLANS}/{planned.json()['id']}/launcher"
    answered: dict[int, int] = {}
    for target, fmt, resource in itertools.product(TARGETS, ("tar.gz", "zip"), (None, "nvidia.com/gpu",
                                                                               "amd.com/gpu")):
        params = {"target": target, "format": fmt, **({"gpu_resource": resource} if resource else {})}
        response = await client.get(launcher, params=params)
        answered[response.status_code] = answered.get(response.status_code, 0) + 1
        if response.status_code != 200:
            problem = assert_problem(response, 422)
            assert problem["errors"][0]["field"] in ("target", "image", "gpu_resource"), problem
            # What to do instead: another target, or the image or resource to give.
            fixes = ("torchrun", "slurm", "k8s", "image", "gpu_resource")
            assert any(fix in problem["detail"].split(":", 2)[-1] for fix in fixes), problem["detail"]
    assert set(answered) <= {200, 422} and answered.get(200), answered
