"""Pipeline parallelism through the API: a pinned degree (search.pipeline_parallel_degrees) is planned,
stored with its pp column, listed and filtered by; its pages show the pipeline; the CLI's --pp plans
the same."""

from __future__ import annotations

import re

import httpx
import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from api.cli.main import app
from api.dashboard import formatting as fmt
from api.db.models import PlanRow
from planner.plan import Plan
from tests.api.conftest import cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
FOUR_CPU_RANKS = cheap_plan(cluster="1x4xcpu", training={"seq_len": 128, "global_batch_tokens": 128 * 16})


def pinned(*schedules: str) -> dict[str, object]:
    search: dict[str, object] = {"pipeline_parallel_degrees": [2]}
    if schedules:
        search["pipeline_schedules"] = list(schedules)
    return {**FOUR_CPU_RANKS, "search": search}


async def test_a_pinned_pipeline_is_planned_stored_listed_and_shown(
    client: httpx.AsyncClient, session: Session
) -> None:
    flat = (await client.post(PLANS, json=FOUR_CPU_RANKS)).json()
    response = await client.post(PLANS, json=pinned("1F1B"))
    assert response.status_code == 201, response.text
    body = response.json()
    plan = Plan.model_validate(body["plan"])
    assert plan.config.mesh.pp == 2 and plan.config.pipeline is not None
    assert plan.config.pipeline.schedule == "1F1B"
    assert body["request"]["search"]["pipeline_parallel_degrees"] == [2]
    assert body["mesh"] == plan.config.mesh.as_document()
    row = session.get(PlanRow, body["id"])
    assert row is not None and row.mesh["pp"] == 2

    listed = (await client.get(PLANS, params={"pp": 2})).json()["items"]
    assert [item["id"] for item in listed] == [body["id"]]
    assert listed[0]["mesh"] == plan.config.mesh.as_document()
    assert [i["id"] for i in (await client.get(PLANS, params={"pp": 1})).json()["items"]] == [flat["id"]]

    page = (await client.get(f"/plans/{body['id']}")).text
    assert 'id="pipeline-timeline"' in page and "<svg" in page
    blocks = plan.config.pipeline.stage_blocks
    assert f"Blocks per stage</dt>\n    <dd>{' / '.join(map(str, blocks))}" in page
    assert plan.prediction.pipeline_bubble_s > 0
    assert f"{fmt.duration(plan.prediction.pipeline_bubble_s)} per step (predicted)" in page
    micro_batches = plan.config.grad_accum_steps
    assert len(re.findall(r'<g class="pp-action"', page)) == 2 * 2 * micro_batches  # 2 ranks x F, B


async def test_every_schedule_can_be_pinned(client: httpx.AsyncClient) -> None:
    for schedule in ("Interleaved1F1B", "ZBVZeroBubble"):
        response = await client.post(PLANS, json=pinned(schedule))
        assert response.status_code == 201, response.text
        pipeline = response.json()["plan"]["config"]["pipeline"]
        assert pipeline["schedule"] == schedule and pipeline["stages_per_rank"] == 2
        page = (await client.get(f"/plans/{response.json()['id']}")).text
        assert 'id="pipeline-timeline"' in page


async def test_a_bad_schedule_is_a_422_naming_the_field(client: httpx.AsyncClient) -> None:
    response = await client.post(PLANS, json=pinned("GPipe"))
    assert response.status_code == 422, response.text
    assert "search.pipeline_schedules" in response.text


def test_the_cli_plans_with_pp() -> None:
    options = ["--model", "llama-debug", "--cluster", "1x4xcpu", "--seq-len", "128", "--global-batch-tokens",
               "2048", "--precision", "fp32", "--pp", "2", "--pp-schedule", "Interleaved1F1B", "--tp", "1"]
    result = CliRunner().invoke(app, ["plan", *options], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(r"mesh +pp 2 x dp_replicate 1 x dp_shard 2 x tp 1 \(blocks in 2 pipeline stages\)",
                     result.output)
    assert re.search(r"pipeline bubble +\S+ \S+/step waiting while the stages fill and drain", result.output)
    assert re.search(r"pipeline +Interleaved1F1B, 2 stage\(s\) per rank, blocks per stage 1/1/1/1",
                     result.output)
