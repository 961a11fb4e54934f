"""The plan form offers pure bf16 training: chosen, it plans what mixed precision cannot fit, the plan
page says so and its *Plan again with changes* keeps it; with fp32 compute the field is refused."""

from __future__ import annotations

import html
import re

from fastapi.testclient import TestClient

from tests.dashboard.conftest import create_plan

ONE_H200_8B = {
    "model_source": "catalog", "model": "llama3-8b", "num_nodes": "1", "gpus_per_node": "1",
    "gpu": "H200-141GB", "seq_len": "4096", "global_batch_tokens": "8192", "precision": "bf16",
    "optimizer": "adamw",
}


def test_the_form_plans_pure_bf16_and_the_page_keeps_it(client: TestClient) -> None:
    page = client.get("/plans/new").text
    assert '<select name="state_dtype"' in page and "pure bf16: no fp32 master" in page
    refused = client.post("/plans/new", data=ONE_H200_8B)
    assert refused.status_code == 422 and "152.8 GiB" in html.unescape(refused.text)
    plan_id = create_plan(client, **ONE_H200_8B, state_dtype="bfloat16")
    detail = html.unescape(client.get(f"/plans/{plan_id}").text)
    assert "bf16 pure (no fp32 master) / adamw" in detail
    again = re.search(r'href="(/plans/new\?[^"]*)"', detail)
    assert again and "state_dtype=bfloat16" in again.group(1)
    assert 'value="bfloat16" selected' in client.get(html.unescape(again.group(1))).text


def test_pure_bf16_with_fp32_compute_is_refused_beside_the_field(client: TestClient) -> None:
    page = client.post("/plans/new", data={**ONE_H200_8B, "precision": "fp32", "state_dtype": "bfloat16"})
    assert page.status_code == 422
    errors = re.search(r'id="error-state_dtype".*?</', page.text, re.S)
    assert errors and "needs precision bf16" in html.unescape(errors.group(0))
