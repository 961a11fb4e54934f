"""Issue 38's hostile inputs, each on the real path and on both databases: answered 4xx naming what to
change, never a 500, and nothing stored by a refused request.

Items 1-5 and the minor ones: a calibration fingerprint beyond a cluster's bounds, NUL characters and
lone UTF-16 surrogates in any text (API bodies, free-form JSON, query strings, dashboard forms, JSON
pasted into a form), a pasted config.json nested 1,000 deep, HTTP Basic credentials of non-ASCII bytes,
`/docs` without the dashboard's security headers, a `Location` that repeated the client's Host, and a
cluster text with a trailing newline.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api import keys
from api.app import create_app
from api.db.models import CalibrationProfileRow, PlanRow, StudyRow, ValidationRunRow
from api.settings import Settings
from planner.bounds import MAX_GPUS_PER_NODE, MAX_NODES
from tests.api.conftest import assert_problem, cheap_plan, cpu_profile

pytestmark = pytest.mark.anyio

CALIBRATIONS = "/api/v1/calibrations"
PLANS = "/api/v1/plans"
STUDIES = "/api/v1/studies"
JSON = {"Content-Type": "application/json"}
LONE_SURROGATE = '"\\ud800"'  # as JSON text: the escape of half a pair
DEBUG_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}
STUDY = {"model": "llama-debug", "token_budget": 10**9, "gpus": [{"gpu": "cpu", "price_per_gpu_hour": 1}],
         "cluster_sizes": {"min_gpus": 1, "max_gpus": 2}, "seq_len": 256, "global_batch_tokens": 2048}


def count(session: Session, row: type) -> int:
    session.expire_all()
    return session.scalar(select(func.count()).select_from(row)) or 0


def fields(problem: dict[str, Any]) -> list[tuple[str, str]]:
    return [(error["location"], error["field"]) for error in problem["errors"]]


@pytest.mark.parametrize(
    ("fingerprint", "field", "bound"),
    [({"gpus_per_node": MAX_GPUS_PER_NODE + 1}, "fingerprint.gpus_per_node", str(MAX_GPUS_PER_NODE)),
     ({"num_nodes": MAX_NODES + 1}, "fingerprint.num_nodes", str(MAX_NODES))],
)
async def test_a_fingerprint_beyond_a_clusters_bounds_is_refused_naming_the_bound(
    client: httpx.AsyncClient, session: Session, fingerprint: dict[str, int], field: str, bound: str
) -> None:
    """Item 1: was a 500 (ClusterSpec's ValidationError, uncaught, when the fit built the cluster)."""
    profile = cpu_profile()
    profile["fingerprint"] = {**profile["fingerprint"], **fingerprint}
    problem = assert_problem(await client.post(CALIBRATIONS, json=profile), 422, "invalid-request")
    assert fields(problem) == [("body", field)]
    assert bound in problem["errors"][0]["message"]
    at_bound = {name: (MAX_GPUS_PER_NODE if name == "gpus_per_node" else MAX_NODES) for name in fingerprint}
    profile["fingerprint"] = {**profile["fingerprint"], **at_bound}
    assert (await client.post(CALIBRATIONS, json=profile)).status_code == 201
    assert count(session, CalibrationProfileRow) == 1


@pytest.mark.parametrize("bad", ["\u0000", "\ud800", "\udfff"], ids=["nul", "high", "low-surrogate"])
async def test_unstorable_text_is_refused_in_every_body_naming_the_field(
    client: httpx.AsyncClient, session: Session, bad: str
) -> None:
    """Items 2 and 3: NUL was a 500 on PostgreSQL (stored on SQLite); a lone surrogate a 500 on both."""
    escaped = json.dumps(bad)  # "\u0000" / "\ud800": the JSON escape
    plan_id = (await client.post(PLANS, json=cheap_plan())).json()["id"]
    profile_with = {
        "name": cpu_profile(name="x"),
        "fingerprint.torch_version": cpu_profile(fingerprint={**cpu_profile()["fingerprint"],
                                                              "torch_version": "x"}),
    }
    cases = [
        *((CALIBRATIONS, body, field) for field, body in profile_with.items()),
        (PLANS, cheap_plan(model={**DEBUG_CONFIG, "architectures": ["x"]}), "model.architectures.0"),
        (PLANS, cheap_plan(name="x"), "name"),
        (STUDIES, {**STUDY, "model": {**DEBUG_CONFIG, "architectures": ["x"]}}, "model.architectures.0"),
        (f"{PLANS}/{plan_id}/runs", {"measured_step_time_s": 1.0, "measured_tokens_per_s_per_gpu": 1000.0,
                                      "raw": {"env": {"host": "x"}}}, "raw.env.host"),
    ]
    tables = (CalibrationProfileRow, PlanRow, StudyRow, ValidationRunRow)
    stored = {row: count(session, row) for row in tables}
    for path, body, field in cases:
        text = json.dumps(body).replace('"x"', escaped, 1)
        response = await client.post(path, content=text.encode(), headers=JSON)
        problem = assert_problem(response, 422, "invalid-request")
        assert fields(problem) == [("body", field)], (path, problem)
        assert f"U+{ord(bad):04X}" in problem["detail"]
    # The same text as raw UTF-8 bytes (ED A0 80 for a surrogate), which Python's JSON reader accepts.
    raw_bad = b'"' + bad.encode("utf-8", "surrogatepass") + b'"'
    raw = json.dumps(cheap_plan(name="x")).encode().replace(b'"x"', raw_bad)
    if bad != "\u0000":  # a raw NUL byte is no JSON at all: the JSON reader's own 400
        assert fields(assert_problem(await client.post(PLANS, content=raw, headers=JSON), 422)) == [
            ("body", "name")]
    assert {row: count(session, row) for row in stored} == stored


async def test_a_key_holding_unstorable_text_is_named_printably(client: httpx.AsyncClient) -> None:
    body = '{"model": {"name\\u0000": 1, "ok": "\\ud83d\\ude00"}, "cluster": "1x2xcpu"}'
    problem = assert_problem(await client.post(PLANS, content=body.encode(), headers=JSON), 422)
    assert fields(problem) == [("body", "model.name\\u0000")]  # the pair (an emoji) is fine


async def test_unstorable_text_in_a_query_is_refused(client: httpx.AsyncClient) -> None:
    problem = assert_problem(await client.get(PLANS, params={"q": "a\u0000"}), 422, "invalid-request")
    assert fields(problem) == [("query", "q")]


async def test_pasted_json_is_bounded_and_checked_in_the_dashboard_form(
    client: httpx.AsyncClient, session: Session
) -> None:
    """Item 4: 1,000 nested brackets in the pasted config.json were a RecursionError (500) on both the
    form and its batch hint; a lone surrogate inside the pasted text (an escape the request's own check
    cannot see) was a 500 too."""
    form = {"model_source": "config", "num_nodes": "1", "gpus_per_node": "2", "gpu": "cpu",
            "seq_len": "256", "global_batch_tokens": "2048"}
    pasted = {
        "[" * 1000 + "]" * 1000: "nested deeper than 32 levels",
        "[" * 100_000: "nested deeper than 32 levels",
        json.dumps(DEBUG_CONFIG).replace('"LlamaForCausalLM"', LONE_SURROGATE): "architectures.0: holds an "
        "unpaired UTF-16 surrogate",
        json.dumps(DEBUG_CONFIG).replace('"LlamaForCausalLM"', '"\\u0000"'): "architectures.0: holds a NUL",
    }
    own_page = {"Sec-Fetch-Site": "same-origin"}
    for text, message in pasted.items():
        sent = {**form, "model_config": text}
        page = await client.post("/plans/new", data=sent, headers=own_page)
        assert page.status_code == 422 and message in page.text, (page.status_code, page.text[:2000])
        # The hint under the batch has nothing to say about a config it cannot read (an empty line).
        hint = await client.post("/plans/new/batch-hint", data=sent, headers=own_page)
        assert (hint.status_code, hint.text) == (200, ""), hint.text[:300]
    assert count(session, PlanRow) == 0


async def test_a_form_field_holding_nul_is_refused(client: httpx.AsyncClient, session: Session) -> None:
    form = {"model_source": "catalog", "model": "llama-debug", "name": "a\u0000b", "num_nodes": "1",
            "gpus_per_node": "2", "gpu": "cpu", "seq_len": "256", "global_batch_tokens": "2048"}
    for encoding in ("urlencoded", "multipart"):
        sent = ({"data": form} if encoding == "urlencoded"
                else {"files": {name: (None, value) for name, value in form.items()}})
        problem = assert_problem(await client.post("/plans/new", **sent), 422, "invalid-request")
        assert fields(problem) == [("body", "name")]
    assert count(session, PlanRow) == 0


@pytest.fixture
async def locked_client(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    app = create_app(settings.model_copy(update={"require_key_for_reads": True}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        yield client, app
    app.state.engine.dispose()


@pytest.mark.parametrize(
    "credentials",
    [b"Basic \xff\xfe\xfd", b"Basic " + "é:ü".encode("latin-1"), b"Basic " + base64.b64encode(b"\xff:\xfe"),
     b"Basic " + base64.b64encode(b"me:fsdpk_\x00\x00\x00\x00\x00\x00\x00\x00_x"), b"Bearer \xff\xfe"],
    ids=["non-ascii", "latin-1", "non-utf8-base64", "nul-prefix", "bearer-non-ascii"],
)
async def test_credentials_of_any_bytes_are_a_401(
    locked_client: tuple[httpx.AsyncClient, FastAPI], session: Session, credentials: bytes
) -> None:
    """Item 5: non-ASCII bytes in Basic credentials were a 500 (base64's ValueError) once a key existed."""
    client, _ = locked_client
    keys.create_key(session, "ops")
    headers = {"Authorization": credentials}
    for path in ("/", "/plans/new", "/studies/new", "/calibrations", "/accuracy"):
        response = await client.get(path, headers=headers)
        assert response.status_code == 401, (path, response.status_code, response.text[:300])
    for path in (PLANS, "/api/v1/calibrations"):
        assert (await client.get(path, headers=headers)).status_code == 401, path
    response = await client.post(PLANS, json=cheap_plan(), headers=headers)
    assert_problem(response, 401, "unauthorized")


async def test_docs_carry_the_dashboards_security_headers(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]  # inline script by hash only
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_location_and_link_never_repeat_the_clients_host(client: httpx.AsyncClient) -> None:
    evil = {"Host": "evil.example"}
    created = await client.post(PLANS, json=cheap_plan(), headers=evil)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"{PLANS}/{created.json()['id']}"
    await client.post(PLANS, json=cheap_plan(training={"seq_len": 128, "global_batch_tokens": 1024}))
    listed = await client.get(PLANS, params={"limit": 1}, headers=evil)
    assert listed.headers["link"].startswith(f"<{PLANS}?") and "evil" not in listed.headers["link"]


@pytest.mark.parametrize("text", ["1x2xcpu\n", "\n1x2xcpu", " 1x2xcpu", "1x2xcpu\t"])
async def test_a_cluster_text_is_read_whole(client: httpx.AsyncClient, session: Session, text: str) -> None:
    problem = assert_problem(await client.post(PLANS, json=cheap_plan(cluster=text)), 422, "invalid-request")
    assert fields(problem) == [("body", "cluster")]
    assert count(session, PlanRow) == 0
