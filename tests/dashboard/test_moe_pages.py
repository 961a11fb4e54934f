"""A mixture-of-experts plan on the dashboard: its plan page splits the peak memory into the routed
experts', the dispatch buffers' and the dense parts', as `fsdp-planner plan` does; a dense plan's page
has no such table."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from api.dashboard import formatting as fmt
from planner.plan import EXPERT_MEMORY_LABELS
from tests.dashboard.conftest import create_plan
from tests.dashboard.test_tensor_parallel_pages import text

QWEN3_MOE_FORM = {"model": "qwen3-30b-a3b", "num_nodes": "1", "gpus_per_node": "8", "gpu": "H100-SXM-80GB",
                  "seq_len": "4096", "global_batch_tokens": "1048576", "state_dtype": "bfloat16"}


def expert_memory_table(html: str) -> list[tuple[str, str, str]]:
    table = re.search(r'<table class="data" id="expert-memory">(.*?)</table>', html, re.S)
    assert table, "no expert memory table on the page"
    rows = re.findall(r"<tr><td[^>]*>(.*?)</td><td[^>]*>(.*?)</td><td[^>]*>(.*?)</td></tr>", table.group(1))
    return [(text(a), text(b), text(c)) for a, b, c in rows]


def test_an_moe_plan_page_splits_its_memory_by_part_of_the_model(client: TestClient) -> None:
    plan_id = create_plan(client, **QWEN3_MOE_FORM, name="qwen3 moe")
    prediction = client.get(f"/api/v1/plans/{plan_id}").json()["plan"]["prediction"]
    parts = prediction["expert_memory_gib"]
    assert set(parts) == set(EXPERT_MEMORY_LABELS)
    # The parts split the peak, adding nothing to it.
    assert abs(sum(parts.values()) - prediction["peak_memory_gib"]) < 1e-6 * prediction["peak_memory_gib"]

    rows = expert_memory_table(client.get(f"/plans/{plan_id}").text)
    peak = prediction["peak_memory_gib"]
    assert rows == [
        (label, fmt.gib(parts[name]), fmt.percent(parts[name] / peak))
        for name, label in EXPERT_MEMORY_LABELS.items()
    ]


def test_a_dense_plan_page_has_no_expert_memory_table(client: TestClient) -> None:
    plan_id = create_plan(client, name="gpt2 dense")
    prediction = client.get(f"/api/v1/plans/{plan_id}").json()["plan"]["prediction"]
    assert prediction.get("expert_memory_gib") is None
    assert 'id="expert-memory"' not in client.get(f"/plans/{plan_id}").text
