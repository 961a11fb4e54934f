"""What real trainers do, through the API, the plan page and the CLI: pure bf16 training (pinned by the
request, planned where mixed precision cannot fit, shown as what it is; with fp32 compute a 422 names
the field) and checkpointing the first n blocks (searched when the request allows it)."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from api.cli.main import app as cli
from tests.api.conftest import assert_problem

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
ONE_H200_8B = {
    "model": "llama3-8b", "cluster": "1x1xH200",
    "training": {"seq_len": 4096, "global_batch_tokens": 4096 * 2},
    "search": {"compile": [True], "checkpointing": ["none", "full"]},
}


def pure(body: dict, **training: str) -> dict:
    return {**body, "training": {**body["training"], "state_dtype": "bfloat16", **training}}


async def test_pure_bf16_plans_what_mixed_precision_cannot_fit(client: httpx.AsyncClient) -> None:
    mixed = assert_problem(await client.post(PLANS, json=ONE_H200_8B), 422)
    assert "needs 152.8 GiB" in mixed["detail"]
    created = await client.post(PLANS, json=pure(ONE_H200_8B))
    assert created.status_code == 201, created.text
    plan = created.json()["plan"]
    assert plan["training"]["state_dtype"] == "bfloat16"
    assert plan["config"]["param_dtype"] == plan["config"]["reduce_dtype"] == "bfloat16"
    assert plan["prediction"]["memory_breakdown_gib"]["params"] == pytest.approx(
        2 * plan["model"]["num_params"] / 2**30, rel=1e-6
    )
    page = await client.get(f"/plans/{created.json()['id']}")
    assert "bf16 pure (no fp32 master) / adamw" in page.text


async def test_pure_bf16_with_fp32_compute_is_a_422_naming_the_field(client: httpx.AsyncClient) -> None:
    problem = assert_problem(await client.post(PLANS, json=pure(ONE_H200_8B, precision="fp32")), 422)
    assert "state_dtype" in problem["detail"] and "training.precision to bf16" in problem["detail"]


def test_the_cli_pins_it_and_says_so() -> None:
    args = ["plan", "--model", "llama3-8b", "--cluster", "1x1xH200", "--seq-len", "4096",
            "--global-batch-tokens", "8192", "--state-dtype", "bfloat16", "--top", "1"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "bf16 pure (no fp32 master)" in " ".join(result.output.split())
    refused = CliRunner().invoke(cli, [*args, "--precision", "fp32"])
    assert refused.exit_code != 0 and "--state-dtype to float32" in " ".join(refused.output.split())


async def test_checkpointing_n_blocks_is_searched_when_allowed_and_shown(client: httpx.AsyncClient) -> None:
    body = {
        "model": "llama3-8b", "cluster": "1x8xH100",
        "training": {"seq_len": 8192, "global_batch_tokens": 8192 * 16},
        "search": {"compile": [False], "checkpointing": ["blocks"], "tensor_parallel_degrees": [1]},
    }
    created = await client.post(PLANS, json=body)
    assert created.status_code == 201, created.text
    checkpointing = created.json()["plan"]["config"]["checkpointing"]
    assert checkpointing["mode"] == "blocks" and checkpointing["blocks"] in (8, 16, 24)
    page = await client.get(f"/plans/{created.json()['id']}")
    assert f"AC=first{checkpointing['blocks']}" in page.text
    assert f"the first {checkpointing['blocks']} blocks recomputed" in page.text
    # compare shows the count beside a plan that checkpoints otherwise (not applicable there).
    other = await client.post(PLANS, json={**body, "search": {**body["search"], "checkpointing": ["full"]}})
    ids = f"{created.json()['id']},{other.json()['id']}"
    compared = await client.get("/api/v1/plans/compare", params={"ids": ids})
    (row,) = [f for f in compared.json()["fields"] if f["field"] == "config.checkpointing.blocks"]
    assert row["values"] == [checkpointing["blocks"], None] and row["differs"]


def test_a_what_if_study_plans_every_candidate_in_pure_bf16() -> None:
    args = ["whatif", "--model", "llama3-8b", "--gpu", "H200", "--sizes", "1", "--tokens", "1B",
            "--seq-len", "4096", "--global-batch-tokens", "8192", "--json"]  # fmt: skip
    mixed = CliRunner().invoke(cli, args)
    pure = CliRunner().invoke(cli, [*args, "--state-dtype", "bfloat16"])
    assert mixed.exit_code == 0 and pure.exit_code == 0, pure.output
    mixed_point, pure_point = (json.loads(r.output)["points"][0] for r in (mixed, pure))
    assert not mixed_point["fits"] and "152.8 GiB" in mixed_point["reason"]
    assert pure_point["fits"] and pure_point["peak_memory_gib"] == pytest.approx(96.7, abs=0.1)
    assert json.loads(pure.output)["request"]["state_dtype"] == "bfloat16"
    assert "state_dtype" not in json.loads(mixed.output)["request"]  # stored as before
