"""Float8 through the API: asked for, it is searched, stored and compared; where the GPU cannot run
it, a 422 names the field and nothing is stored."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from tests.api.conftest import assert_problem

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
H100_8B = {
    "model": "llama3-8b", "cluster": "1x8xH100",
    "training": {"seq_len": 4096, "global_batch_tokens": 4096 * 8},
    "search": {"compile": [True], "tensor_parallel_degrees": [1], "checkpointing": ["none", "full"]},
}


def with_float8(body: dict, recipes: list[str]) -> dict:
    return {**body, "search": {**body["search"], "float8": recipes}}


async def test_float8_is_searched_stored_and_compared(client: httpx.AsyncClient) -> None:
    bf16 = await client.post(PLANS, json=H100_8B)
    fp8 = await client.post(PLANS, json=with_float8(H100_8B, ["none", "tensorwise"]))
    assert bf16.status_code == fp8.status_code == 201, fp8.text
    assert bf16.json()["plan"]["config"]["float8"] == "none"
    chosen = fp8.json()["plan"]
    assert chosen["config"]["float8"] == "tensorwise"
    faster = chosen["prediction"]["tokens_per_s_per_gpu"]
    assert faster > bf16.json()["plan"]["prediction"]["tokens_per_s_per_gpu"]
    ids = f"{bf16.json()['id']},{fp8.json()['id']}"
    compared = await client.get("/api/v1/plans/compare", params={"ids": ids})
    assert compared.status_code == 200, compared.text
    (row,) = [f for f in compared.json()["fields"] if f["field"] == "config.float8"]
    assert row["values"] == ["none", "tensorwise"] and row["differs"]
    page = await client.get(f"/plans/{fp8.json()['id']}")
    assert "Float8 training" in page.text and "tensorwise (torchao)" in page.text


async def test_float8_on_a_gpu_without_it_is_a_422_naming_the_field(
    client: httpx.AsyncClient, session: Session
) -> None:
    before = session.scalar(select(func.count()).select_from(PlanRow))
    body = with_float8({**H100_8B, "cluster": "1x8xA100"}, ["tensorwise"])
    problem = assert_problem(await client.post(PLANS, json=body), 422)
    assert "search.float8: tensorwise: the A100-80GB has no float8 tensor cores" in problem["detail"]
    unknown = assert_problem(await client.post(PLANS, json=with_float8(H100_8B, ["fp4"])), 422)
    assert "search.float8" in unknown["detail"]
    assert session.scalar(select(func.count()).select_from(PlanRow)) == before
