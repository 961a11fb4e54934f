"""A layer graph written by `fsdp-planner trace` is a model the API plans, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from api.cli.main import app
from planner.plan import Plan
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"


@pytest.fixture(scope="module")
def traced_debug_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The catalog's llama-debug, traced by the real command (torch on the meta device)."""
    pytest.importorskip("torch", reason="trace needs the executor extra (torch)")
    graph = tmp_path_factory.mktemp("trace") / "graph.json"
    result = CliRunner().invoke(
        app,
        ["trace", "tests.profile.trace_models:llama_debug", "--arg", "seq_len=256", "--seq-len", "256",
         "--name", "traced-llama-debug", "-o", str(graph)],
    )
    assert result.exit_code == 0, result.output
    return json.loads(Path(graph).read_text())


async def test_a_traced_graph_plans_like_the_catalog_model(
    client: httpx.AsyncClient, traced_debug_model: dict[str, Any]
) -> None:
    traced = await client.post(PLANS, json=cheap_plan(model=traced_debug_model))
    catalog = await client.post(PLANS, json=cheap_plan())
    assert (traced.status_code, catalog.status_code) == (201, 201), traced.text

    body = traced.json()
    assert body["model_name"] == "traced-llama-debug"
    assert body["request"]["model"]["layer_graph"] == traced_debug_model["layer_graph"]
    plan, reference = Plan.model_validate(body["plan"]), Plan.model_validate(catalog.json()["plan"])
    assert plan.model.architecture == "layer_graph"
    assert plan.model.num_params == reference.model.num_params == 4_196_608
    # Training FLOPs per token (the MFU numerator): the same model, within 2%.
    assert abs(plan.model.flops_per_token / reference.model.flops_per_token - 1) < 0.02
    assert plan.prediction.tokens_per_s_per_gpu > 0 and plan.prediction.peak_memory_gib > 0
    assert (await client.get(f"{PLANS}/{body['id']}")).json() == body


async def test_an_empty_layer_graph_names_the_command_that_writes_one(client: httpx.AsyncClient) -> None:
    body = cheap_plan(model={"name": "mine", "architecture": "layer_graph"})
    problem = assert_problem(await client.post(PLANS, json=body), 422)

    command = re.search(r"`fsdp-planner (trace [^`]+)`", problem["detail"])
    assert command is not None, problem["detail"]
    # The command it names exists, with the arguments it shows.
    usage = CliRunner().invoke(app, [*command.group(1).split(), "--help"])
    assert usage.exit_code == 0, usage.output
    assert "PACKAGE.MODULE:FACTORY" in usage.output and "--output" in usage.output
