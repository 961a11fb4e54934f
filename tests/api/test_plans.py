"""POST/GET/DELETE /plans: planning, storing, dedup by input hash, and the errors a person can act on."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from planner.plan import Plan
from tests.api.conftest import assert_problem, cheap_plan, cpu_profile

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"


def count_plans(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(PlanRow)) or 0


async def test_create_returns_201_location_and_the_whole_plan(
    client: httpx.AsyncClient, session: Session
) -> None:
    response = await client.post(PLANS, json=cheap_plan(name="first try"))
    assert response.status_code == 201, response.text
    body = response.json()
    assert response.headers["location"] == f"{PLANS}/{body['id']}"
    plan = Plan.model_validate(body["plan"])  # the stored document is a valid Plan
    assert body["name"] == "first try"
    assert (body["model_name"], body["gpu"], body["world_size"]) == ("llama-debug", "cpu", 2)
    assert body["plan_hash"] == plan.plan_hash and len(body["plan_hash"]) == 64
    assert body["tokens_per_s_per_gpu"] == plan.prediction.tokens_per_s_per_gpu > 0
    assert body["peak_memory_gib"] == plan.prediction.peak_memory_gib > 0
    assert body["mfu"] == plan.prediction.mfu and body["step_time_s"] == plan.prediction.step_time_s
    assert body["request"]["model"]["name"] == "llama-debug"  # the resolved spec, not the name
    assert body["request"]["model"]["hidden_size"] == 256
    assert body["calibration_id"] is None and plan.calibration_id is None

    fetched = await client.get(response.headers["location"])
    assert fetched.status_code == 200
    assert fetched.json() == body
    assert count_plans(session) == 1


async def test_identical_inputs_return_the_stored_plan(client: httpx.AsyncClient, session: Session) -> None:
    first = await client.post(PLANS, json=cheap_plan())
    # Same plan spelled differently: cluster as an object, defaults written out, another name.
    again = await client.post(
        PLANS,
        json=cheap_plan(
            cluster={"num_nodes": 1, "gpus_per_node": 2, "gpu": "CPU"},
            training={"seq_len": 256, "global_batch_tokens": 2048, "precision": "bf16", "optimizer": "adamw"},
            name="another name",
            top_k=5,
        ),
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["name"] == first.json()["name"] == "llama-debug on 1x2xcpu"
    assert again.headers["location"] == first.headers["location"]
    assert count_plans(session) == 1


async def test_a_different_input_is_a_different_plan(client: httpx.AsyncClient, session: Session) -> None:
    a = await client.post(PLANS, json=cheap_plan())
    b = await client.post(PLANS, json=cheap_plan(top_k=2))
    c = await client.post(PLANS, json=cheap_plan(training={"seq_len": 256, "global_batch_tokens": 4096}))
    assert {a.status_code, b.status_code, c.status_code} == {201}
    assert len({a.json()["plan_hash"], b.json()["plan_hash"], c.json()["plan_hash"]}) == 3
    assert len(b.json()["plan"]["alternatives"]) <= 2
    assert count_plans(session) == 3


async def test_hugging_face_config_and_model_spec_inputs(client: httpx.AsyncClient) -> None:
    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": "tiny-llama",
        "vocab_size": 4096,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 1024,
    }
    response = await client.post(PLANS, json=cheap_plan(model=hf_config))
    assert response.status_code == 201, response.text
    assert response.json()["model_name"] == "tiny-llama"

    layer_graph = {
        "name": "traced-mlp",
        "architecture": "layer_graph",
        "layer_graph": [
            {
                "name": "embed",
                "num_params": 1_000_000,
                "fwd_flops_per_token": 0,
                "activation_bytes_per_token": 1024,
                "is_block": False,
            },
            *(
                {
                    "name": f"blocks.{i}",
                    "num_params": 4_000_000,
                    "fwd_flops_per_token": 8e6,
                    "activation_bytes_per_token": 16384,
                }
                for i in range(4)
            ),
        ],
    }
    response = await client.post(PLANS, json=cheap_plan(model=layer_graph))
    assert response.status_code == 201, response.text
    assert response.json()["model_name"] == "traced-mlp"
    assert response.json()["request"]["model"]["layer_graph"][1]["name"] == "blocks.0"


async def test_calibration_id_must_name_a_stored_profile(client: httpx.AsyncClient, session: Session) -> None:
    missing = await client.post(PLANS, json=cheap_plan(calibration_id=12345))
    problem = assert_problem(missing, 422, "unknown-calibration")
    assert problem["errors"][0]["field"] == "calibration_id"
    assert "12345" in problem["detail"]

    uploaded = await client.post("/api/v1/calibrations", json=cpu_profile())
    assert uploaded.status_code == 201, uploaded.text
    profile_id = uploaded.json()["id"]
    with_profile = await client.post(PLANS, json=cheap_plan(calibration_id=profile_id))
    without = await client.post(PLANS, json=cheap_plan())
    assert (with_profile.status_code, without.status_code) == (201, 201)
    assert with_profile.json()["calibration_id"] == profile_id
    assert with_profile.json()["plan"]["calibration_id"] == str(profile_id)
    # The calibration used is part of the input hash: these are two plans.
    assert with_profile.json()["plan_hash"] != without.json()["plan_hash"]


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        (cheap_plan(model="gpt-17"), "model", "known models"),
        (cheap_plan(cluster="1x2xTPU"), "cluster.gpu", "known GPUs"),
        (cheap_plan(cluster="two nodes"), "cluster", "NODESxGPUSxGPU"),
        (
            cheap_plan(training={"seq_len": 256, "global_batch_tokens": 1000}),
            "training.global_batch_tokens",
            "multiple of seq_len",
        ),
        (cheap_plan(cluster="1x3xcpu"), "training.global_batch_tokens", "split evenly over 3 GPUs"),
        (cheap_plan(model={"architectures": ["BertModel"]}), "model", "supported"),
        (
            cheap_plan(model={"name": "odd", "architecture": "llama", "hidden_size": 100, "num_heads": 3}),
            "model",
            "divide hidden_size",
        ),
    ],
)
async def test_unplannable_inputs_are_422_naming_the_field(
    client: httpx.AsyncClient, session: Session, body: dict, field: str, needle: str
) -> None:
    problem = assert_problem(await client.post(PLANS, json=body), 422)
    assert needle in problem["detail"]
    assert field in [error["field"] for error in problem["errors"]], problem
    assert "Value error" not in problem["detail"]
    assert count_plans(session) == 0


async def test_infeasible_plan_says_what_would_fit(client: httpx.AsyncClient) -> None:
    body = {
        "model": "llama3-70b",
        "cluster": "1x2xL4",
        "training": {"seq_len": 4096, "global_batch_tokens": 8192},
    }
    problem = assert_problem(await client.post(PLANS, json=body), 422, "infeasible-plan")
    assert "does not fit" in problem["detail"]
    assert problem["capacity_gib"] > 0
    assert problem["min_peak_memory_gib"] > problem["capacity_gib"]
    assert problem["min_fitting_nodes"] is None or problem["min_fitting_nodes"] > 1


async def test_get_missing_plan_is_404(client: httpx.AsyncClient) -> None:
    problem = assert_problem(await client.get(f"{PLANS}/999999"), 404, "plan-not-found")
    assert "999999" in problem["detail"]
    # Ids beyond BIGINT are refused as invalid, not passed to the database.
    assert_problem(await client.get(f"{PLANS}/{2**63}"), 422, "invalid-request")
    assert_problem(await client.get(f"{PLANS}/abc"), 422, "invalid-request")


async def test_delete(client: httpx.AsyncClient, session: Session) -> None:
    keep = (await client.post(PLANS, json=cheap_plan(top_k=1))).json()
    gone = (await client.post(PLANS, json=cheap_plan())).json()
    response = await client.delete(f"{PLANS}/{gone['id']}")
    assert response.status_code == 204 and response.content == b""
    assert_problem(await client.get(f"{PLANS}/{gone['id']}"), 404)
    assert_problem(await client.delete(f"{PLANS}/{gone['id']}"), 404, "plan-not-found")
    assert (await client.get(f"{PLANS}/{keep['id']}")).status_code == 200
    assert count_plans(session) == 1
    # Deleting frees the input hash: the same request plans and stores again.
    again = await client.post(PLANS, json=cheap_plan())
    assert again.status_code == 201 and again.json()["id"] != gone["id"]


async def test_catalogs(client: httpx.AsyncClient) -> None:
    models = {m["name"]: m for m in (await client.get("/api/v1/models")).json()}
    assert 7.9e9 < models["llama3-8b"]["num_params"] < 8.1e9
    assert models["llama3-8b"]["num_kv_heads"] == 8
    assert 120e6 < models["gpt2"]["num_params"] < 130e6
    assert models["llama3-8b"]["active_params"] is None
    assert 36e9 < models["deepseek-v3"]["active_params"] < 38e9 < 670e9 < models["deepseek-v3"]["num_params"]
    gpus = {g["name"]: g for g in (await client.get("/api/v1/gpus")).json()}
    assert "H100" in gpus["H100-SXM-80GB"]["aliases"]
    assert gpus["H100-SXM-80GB"]["memory_gib"] > 70


async def test_health(client: httpx.AsyncClient, backend: str) -> None:
    for path in ("/healthz", "/api/v1/healthz"):
        assert (await client.get(path)).json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready == {"status": "ready", "database": backend, "schema_revision": "0011"}
