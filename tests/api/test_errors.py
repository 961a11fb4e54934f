"""Every error is application/problem+json with an actionable detail; hostile bodies are 4xx, never 500."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
JSON = {"content-type": "application/json"}


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    problem = assert_problem(
        await client.post(PLANS, content=b'{"model": "gpt2",', headers=JSON), 400, "malformed-json"
    )
    assert "not valid JSON" in problem["detail"]


def nested(levels: int) -> list:
    """`levels` arrays, one inside the other."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        # Past the parser's recursion (FastAPI answered these with a bare "error parsing the body").
        (PLANS, b"[" * 1200 + b"]" * 1200, ""),
        (PLANS, b"[" * 50_000, ""),
        ("/api/v1/calibrations", b'{"name": ' * 5_000, ""),
        # Readable, but past the bound: the first value too deep is named.
        (PLANS, json.dumps(cheap_plan(model={"a": nested(32)})), "model.a" + ".0" * 31),
        ("/api/v1/plans/1/runs", json.dumps({"steps": 1, "raw": {"x": nested(32)}}), "raw.x" + ".0" * 31),
    ],
)
async def test_json_nested_past_the_bound_is_refused_naming_it(
    client: httpx.AsyncClient, path: str, body: str | bytes, field: str
) -> None:
    problem = assert_problem(await client.post(path, content=body, headers=JSON), 422, "invalid-request")
    assert "nested deeper than 32 levels" in problem["detail"]
    errors = [(e["location"], e["field"], e["type"]) for e in problem["errors"]]
    assert errors == [("body", field, "json_depth")]


async def test_json_at_the_bound_is_read(client: httpx.AsyncClient) -> None:
    """32 levels are within the bound: the route reads the body and answers for its fields."""
    body = json.dumps(cheap_plan(model={"a": nested(31)}))
    response = await client.post(PLANS, content=body, headers=JSON)
    assert response.status_code == 422, response.text
    assert all(e["type"] != "json_depth" for e in response.json()["errors"]), response.text


async def test_body_not_utf8_is_400_naming_the_byte(client: httpx.AsyncClient) -> None:
    problem = assert_problem(
        await client.post(PLANS, content=b'{"model": "\xff"}', headers=JSON),
        400, "malformed-json",
    )
    assert problem["detail"] == "the request body is not valid JSON: byte 11 (0xff) is not UTF-8"


async def test_not_json_is_415(client: httpx.AsyncClient) -> None:
    problem = assert_problem(
        await client.post(
            PLANS, content=b"model=gpt2", headers={"content-type": "application/x-www-form-urlencoded"}
        ),
        415,
    )
    assert "application/json" in problem["detail"]


async def test_field_errors_list_every_invalid_input(client: httpx.AsyncClient) -> None:
    body = {
        "model": 7,
        "cluster": {"gpus_per_node": "8", "gpu": "H100", "racks": 2},
        "training": {"seq_len": -1},
        "top_k": 0,
        "surprise": True,
    }
    problem = assert_problem(await client.post(PLANS, json=body), 422, "invalid-request")
    fields = {error["field"] for error in problem["errors"]}
    assert {
        "model",
        "cluster.gpus_per_node",
        "cluster.racks",
        "training.seq_len",
        "training.global_batch_tokens",
        "top_k",
        "surprise",
    } <= fields
    assert all(error["location"] == "body" for error in problem["errors"])
    assert "catalog model name" in next(e["message"] for e in problem["errors"] if e["field"] == "model")


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'"llama3-8b"',
        b"null",
        b"1e999999",
        b"[" * 50_000,
        b'{"model": ' * 5_000,
        json.dumps(cheap_plan(name="x\u0000y")).encode(),
        json.dumps(cheap_plan(model={"name\u0000": 1})).encode(),
        b'{"model": {"a": ' + b"[" * 40 + b"{}" + b"]" * 40 + b"}}",
        json.dumps(cheap_plan(training={"seq_len": 10**30, "global_batch_tokens": 10**31})).encode(),
        json.dumps(cheap_plan(cluster={"gpu": "cpu", "inter_node_bandwidth_gbps": float("nan")})).encode(),
        json.dumps(cheap_plan(cluster={"gpu": "cpu", "num_nodes": 2**64})).encode(),
        json.dumps(cheap_plan(calibration_id=2**64)).encode(),
        json.dumps(cheap_plan(model={"name": "huge", "architecture": "llama", "num_layers": 10**9})).encode(),
        # Heads that do not divide a huge hidden size: the suggested head count was found by trying
        # every number up to hidden_size (a request that never ended).
        json.dumps(cheap_plan(model={"name": "wide", "architecture": "llama", "hidden_size": 10**15 + 37,
                                     "num_heads": 7})).encode(),
        json.dumps(
            cheap_plan(model={"name": "x", "architecture": "layer_graph", "layer_graph": []})
        ).encode(),
        json.dumps(cheap_plan(model={"architectures": "LlamaForCausalLM"})).encode(),
        json.dumps(cheap_plan(model={"architectures": ["LlamaForCausalLM"], "hidden_size": "4096"})).encode(),
        '{"model": "\ud800"}'.encode("utf-8", "surrogatepass"),
        b"\xff\xfe{}",
    ],
)
async def test_hostile_bodies_are_4xx_problems(client: httpx.AsyncClient, body: bytes) -> None:
    response = await client.post(PLANS, content=body, headers=JSON)
    assert 400 <= response.status_code < 500, response.text
    assert_problem(response, response.status_code)


@pytest.fixture
async def small_limit_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"max_body_bytes": 4096}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        yield client
    app.state.engine.dispose()


async def test_body_over_the_limit_is_413(small_limit_client: httpx.AsyncClient) -> None:
    big = cheap_plan(name="x" * 100, model={"padding": "y" * 5000})
    problem = assert_problem(await small_limit_client.post(PLANS, json=big), 413, "body-too-large")
    assert "4096-byte limit" in problem["detail"]
    # The limit holds where nothing reads the body, too.
    assert_problem(await small_limit_client.request("DELETE", f"{PLANS}/1", content=b"z" * 5000), 413)
    assert_problem(await small_limit_client.request("GET", "/nowhere", content=b"z" * 5000), 413)


async def test_chunked_body_over_the_limit_is_413(small_limit_client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"model": "'
        for _ in range(10):
            yield b"m" * 1000
        yield b'"}'

    response = await small_limit_client.post(PLANS, content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers
    assert_problem(response, 413, "body-too-large")


async def test_a_body_under_the_limit_passes(small_limit_client: httpx.AsyncClient) -> None:
    assert (await small_limit_client.post(PLANS, json=cheap_plan())).status_code == 201


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    problem = assert_problem(await client.get("/api/v2/plans"), 404)
    assert "/api/v1" in problem["detail"]
    problem = assert_problem(await client.put(f"{PLANS}/1", json={}), 405)
    assert "PUT" in problem["detail"]


async def test_unexpected_errors_are_logged_500_problems_without_internals(
    app: FastAPI, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    def explode() -> None:
        raise RuntimeError("secret internal state")

    app.add_api_route("/api/v1/explode", explode)
    with caplog.at_level(logging.ERROR, logger="api.problems"):
        response = await client.get("/api/v1/explode")
    problem = assert_problem(response, 500, "internal-error")
    assert "secret" not in response.text
    assert "was logged" in problem["detail"]
    assert any(
        "secret internal state" in r.getMessage() or (r.exc_info and "secret" in str(r.exc_info[1]))
        for r in caplog.records
    )


async def test_readyz_is_503_when_the_database_is_down(tmp_path) -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    app = create_app(Settings(database_url=url, migrate_on_startup=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        problem = assert_problem(await client.get("/readyz"), 503, "database-unavailable")
        assert (await client.get("/healthz")).status_code == 200  # alive, just not ready
    assert "DATABASE_URL" in problem["detail"] and "nobody" not in problem["detail"]


async def test_readyz_is_503_when_the_schema_is_behind(tmp_path) -> None:
    app = create_app(
        Settings(database_url=f"sqlite:///{tmp_path / 'empty.sqlite3'}", migrate_on_startup=False)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        problem = assert_problem(await client.get("/readyz"), 503, "database-not-migrated")
    assert "fsdp-planner db upgrade" in problem["detail"]


@pytest.mark.parametrize(
    ("model", "advice"),
    [
        ({"name": "llama3-8b"}, 'pass its name as a string: "model": "llama3-8b"'),
        ({"name": "llama3-8b", "num_layers": 4}, 'pass its name as a string: "model": "llama3-8b"'),
        ({"name": "my-model", "hidden_size": 4096}, 'e.g. "model": "llama3-8b" (catalog: llama2-7b'),
        ({}, 'e.g. "model": "llama3-8b"'),
    ],
)
async def test_a_catalog_model_wrapped_in_an_object_is_told_to_pass_the_name(
    client: httpx.AsyncClient, model: dict, advice: str
) -> None:
    problem = assert_problem(await client.post(PLANS, json=cheap_plan(model=model)), 422)
    assert advice in problem["detail"], problem["detail"]
    assert "Field required" not in problem["detail"]
    assert "full model spec" in problem["detail"] and "config.json" in problem["detail"]
    assert [e["field"] for e in problem["errors"]] == ["model"]


async def test_misnamed_cluster_and_training_fields_name_the_field_meant(client: httpx.AsyncClient) -> None:
    body = cheap_plan(cluster={"nodes": 1, "gpus": 8, "gpu": "H100"},
                      training={"seq_length": 256, "global_batch_tokens": 2048})
    problem = assert_problem(await client.post(PLANS, json=body), 422, "invalid-request")
    messages = {e["field"]: e["message"] for e in problem["errors"]}
    assert 'did you mean "num_nodes"' in messages["cluster.nodes"]
    assert 'did you mean "gpus_per_node"' in messages["cluster.gpus"]
    assert '"1x8xH100"' in messages["cluster.gpus"]
    assert 'did you mean "seq_len"' in messages["training.seq_length"]
    assert "training.seq_len" in messages  # still missing: every problem is listed
    # A key nobody means as a field keeps the plain refusal.
    racks = cheap_plan(cluster={"gpu": "cpu", "racks": 2})
    problem = assert_problem(await client.post(PLANS, json=racks), 422)
    assert [e["type"] for e in problem["errors"]] == ["extra_forbidden"]
