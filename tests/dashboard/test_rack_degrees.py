"""Pinned degrees on racks whose NVLink domain spans nodes (GB200 NVL72: 18 nodes of 4 in a domain of
72), through the command line, the API and the dashboard's plan form:

- a tensor-parallel degree the rack's domain does not divide is refused naming the domain as a domain
  (not as `GPUs per node 72`), the degrees that divide everything, and the domain that would take it;
- every layer takes the same bound on a pinned degree (planner/bounds.py `max_degree`): a rack's
  tp 72 is the planner's to judge, not refused by a form or a list filter at a node's 64;
- the dashboard's plan form states a scale-up domain as the API's cluster does.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.cli.main import app
from contract.mesh import searched_axes
from planner.bounds import MAX_PARALLEL_DEGREE, MAX_SCALEUP_DOMAIN_GPUS, max_degree

runner = CliRunner()
WIDE = {"COLUMNS": "400"}
FIELD = "search.tensor_parallel_degrees"
# llama2-7b: 32 heads and 32 kv heads, so tp 16 splits the model; only a 72-GPU domain is in its way.
RACKS_TP16 = ["plan", "--model", "llama2-7b", "--cluster", "4x72xGB200", "--seq-len", "2048",
              "--global-batch-tokens", "4194304", "--tp", "16"]
# A model whose every size 72 divides: tp 72, a whole NVL72 rack, plans.
TP72_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4608,
    "num_attention_heads": 72, "num_key_value_heads": 72, "intermediate_size": 18432, "vocab_size": 72000,
    "num_hidden_layers": 4, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}


def one_line(text: str) -> str:
    return " ".join(text.split())


def errors_beside_fields(page: str) -> dict[str, str]:
    return {name: one_line(html.unescape(text)) for name, text in
            re.findall(r'id="error-([a-z_]+)"[^>]*>(.*?)</', page, re.S)}


def test_a_tp_the_rack_does_not_divide_names_the_nvlink_domain_and_the_fix() -> None:
    result = runner.invoke(app, RACKS_TP16, env=WIDE)
    assert result.exit_code == 2, result.output
    words = one_line(result.output)
    assert "GPUs per node 72" not in words and "gpus_per_node" not in words
    assert ("--cluster's GPUs per scale-up domain 72 (one NVLink or Infinity Fabric domain of 18 nodes of 4: "
            "a rack) (tensor parallelism stays inside a scale-up domain") in words
    assert "pick a common divisor: tp 2, 4 or 8; or, for tp 16, describe domains of 64 GPUs" in words
    # The advice plans: 64 GPUs of each rack (16 of its 18 nodes) are domains that tp 16 tiles.
    advised = [*RACKS_TP16[:4], "4x64xGB200", *RACKS_TP16[5:]]
    planned = runner.invoke(app, advised, env=WIDE)
    assert planned.exit_code == 0, planned.output
    assert "tp16" in planned.output


def test_a_node_of_eight_is_still_named_as_a_node() -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "8192",
                                 "--global-batch-tokens", "131072", "--tp", "3"], env=WIDE)
    assert result.exit_code == 2, result.output
    words = one_line(result.output)
    assert "--cluster's GPUs per node 8 (tensor parallelism stays inside a node" in words
    assert "pick a common divisor: tp 2, 4 or 8" in words and "scale-up domain" not in words


def test_part_of_a_rack_is_one_domain_that_takes_tp_16() -> None:
    """16 nodes of an NVL72 rack: 64 GPUs on one fabric, so tp 16 groups stay on it (not refused because
    the rack would hold 72)."""
    result = runner.invoke(app, [*RACKS_TP16[:4], "16x4xGB200", *RACKS_TP16[5:]], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "tp16" in result.output


def test_every_layer_bounds_a_pinned_degree_alike(client: TestClient) -> None:
    # The API's schema: the pin fields and the list's filters state max_degree.
    schema = client.get("/openapi.json").json()
    search = schema["components"]["schemas"]["SearchSpace"]["properties"]
    filters = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/plans"]["get"]["parameters"]}
    for entry in searched_axes():
        pinned = search[entry.search_field]["anyOf"][0]["items"]
        assert pinned["maximum"] == max_degree(entry), entry.name
        assert filters[entry.name]["anyOf"][0]["maximum"] == max_degree(entry), entry.name
    assert max_degree(next(e for e in searched_axes() if e.name == "tp")) == MAX_SCALEUP_DOMAIN_GPUS
    assert max_degree(next(e for e in searched_axes() if e.name == "ep")) == MAX_PARALLEL_DEGREE
    # A rack's 72 passes every bound; out of range, each layer says the range and why.
    assert client.get("/api/v1/plans", params={"tp": 72, "ep": 72}).status_code == 200
    assert client.get("/", params={"tp": "72"}).status_code == 200
    assert "must be a whole number" not in client.get("/", params={"tp": "72"}).text
    refused = client.post("/api/v1/plans", json={
        "model": "llama3-8b", "cluster": "1x72xGB200",
        "training": {"seq_len": 2048, "global_batch_tokens": 4194304},
        "search": {"tensor_parallel_degrees": [1025], "expert_parallel_degrees": [2000]},
    })
    assert refused.status_code == 422, refused.text
    detail = {e["field"]: e["message"] for e in refused.json()["errors"]}
    assert "give whole numbers from 1 to 1024 (GPUs of one scale-up domain" in detail[f"{FIELD}.0"]
    assert "2000 is not an expert-parallel degree" in detail["search.expert_parallel_degrees.0"]
    cli = runner.invoke(app, [*RACKS_TP16[:-1], "1025"], env=WIDE)
    assert cli.exit_code == 2 and "give whole numbers from 1 to 1024" in one_line(cli.output), cli.output


def test_a_rack_wide_tp_plans_through_the_api(client: TestClient) -> None:
    response = client.post("/api/v1/plans", json={
        "model": TP72_CONFIG, "cluster": "1x72xGB200",
        "training": {"seq_len": 4608, "global_batch_tokens": 4608},
        "search": {"tensor_parallel_degrees": [72]},
    })
    assert response.status_code == 201, response.text
    assert response.json()["mesh"]["tp"] == 72


RACK_FORM = {
    "model_source": "catalog", "model": "llama2-7b", "num_nodes": "18", "gpus_per_node": "4", "gpu": "GB200",
    "seq_len": "2048", "global_batch_tokens": "4194304", "precision": "bf16", "optimizer": "adamw",
    "state_dtype": "float32",
}


def test_the_plan_form_states_a_scale_up_domain(client: TestClient) -> None:
    page = html.unescape(client.get("/plans/new").text)
    assert 'name="scaleup_domain_gpus"' in page and "72 for GB200 and GB300" in page
    # Empty: the GPU's system (72 for GB200), which tp 16 does not divide; the refusal says what to type.
    refused = client.post("/plans/new", data={**RACK_FORM, "tensor_parallel_degree": "16"})
    assert refused.status_code == 422
    said = errors_beside_fields(refused.text)["tensor_parallel_degree"]
    assert "scaleup_domain_gpus 72 (one NVLink or Infinity Fabric domain of 18 nodes of 4" in said
    assert "describe domains of 64 GPUs" in said
    # Stated: 16 nodes of 4 in domains of 64 plan tp 16, and the plan's "again" link keeps the domain.
    planned = client.post("/plans/new", data={**RACK_FORM, "num_nodes": "16", "scaleup_domain_gpus": "64",
                                               "tensor_parallel_degree": "16"}, follow_redirects=False)
    assert planned.status_code == 303, errors_beside_fields(planned.text)
    detail = html.unescape(client.get(planned.headers["location"]).text)
    assert "16 × 4 × GB200 in scale-up domains of 64" in detail  # the plan's inputs name the domain
    again = re.search(r'href="(/plans/new\?[^"]*)"', detail)
    assert again and "scaleup_domain_gpus=64" in again.group(1)
    assert 'value="64"' in client.get(again.group(1)).text
    plan = client.get(f"/api/v1{planned.headers['location']}").json()
    assert plan["mesh"]["tp"] == 16 and plan["request"]["cluster"]["scaleup_domain_gpus"] == 64


@pytest.mark.parametrize(("typed", "said"), [
    ("6", "6 is not a whole number of 4-GPU nodes"),
    ("abc", "enter the GPUs per scale-up domain as a whole number"),
    ("2048", "less than or equal to 1024"),
])
def test_a_domain_the_form_cannot_take_is_refused_beside_it(
    client: TestClient, typed: str, said: str
) -> None:
    page = client.post("/plans/new", data={**RACK_FORM, "scaleup_domain_gpus": typed})
    assert page.status_code == 422
    assert said in errors_beside_fields(page.text).get("scaleup_domain_gpus", ""), page.text[-2000:]


def test_a_rack_wide_tp_plans_from_the_form(client: TestClient) -> None:
    form = {**RACK_FORM, "model_source": "config", "model_config": json.dumps(TP72_CONFIG), "seq_len": "4608",
            "global_batch_tokens": "4608", "tensor_parallel_degree": "72"}
    planned = client.post("/plans/new", data=form, follow_redirects=False)
    assert planned.status_code == 303, errors_beside_fields(planned.text)
