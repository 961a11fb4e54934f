"""Admission by cost (issue 38, item 6): a request's search lists are capped as sent, de-duplicated and
put in one order, and a search space too large to price is refused before anything is priced; two
requests whose lists differ only by duplicates or order store one plan.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from planner.enumeration import MAX_SEARCH_SPACE
from planner.specs import MAX_SEARCH_OPTIONS
from tests.api.conftest import CHEAP_PLAN, assert_problem, cheap_plan
from tests.api.test_studies import study

PLANS = "/api/v1/plans"
STUDIES = "/api/v1/studies"
# A default search of the largest space a request may name, with every Float8 recipe an H100 takes:
# more than MAX_SEARCH_SPACE configurations (about 2.0 million), refused without pricing one.
TOO_LARGE: dict[str, Any] = {
    "model": "llama2-7b", "cluster": "4096x64xH100",
    "training": {"seq_len": 32768, "global_batch_tokens": 2**36},
    "search": {"float8": ["none", "tensorwise", "rowwise"]},
}
# Each search list at its cap, and one past it.
LISTS: dict[str, list[Any]] = {
    "shardings": ["full_shard", "no_shard"],
    "compile": [True, False],
    "checkpointing": ["none", "full"],
    "pipeline_schedules": ["1F1B", "ZBVZeroBubble"],
    "float8": ["none"],
    "tensor_parallel_degrees": [1, 2],
    "context_parallel_degrees": [1],
    "pipeline_parallel_degrees": [1],
}


def _repeated(values: list[Any], length: int) -> list[Any]:
    return [values[i % len(values)] for i in range(length)]


async def _stored_plans(client: httpx.AsyncClient) -> int:
    response = await client.get(PLANS)
    assert response.status_code == 200, response.text
    return len(response.json()["items"])


@pytest.mark.anyio
@pytest.mark.parametrize("field", sorted(LISTS))
async def test_a_search_list_past_its_cap_is_refused_naming_the_field_and_the_limit(
    client: httpx.AsyncClient, field: str
) -> None:
    body = cheap_plan(search={field: _repeated(LISTS[field], 10_000)})
    started = time.perf_counter()
    problem = assert_problem(await client.post(PLANS, json=body), 422, "invalid-request")
    assert time.perf_counter() - started < 5  # refused as read, nothing searched (it took 93 s)
    assert [error["field"] for error in problem["errors"]] == [f"search.{field}"]
    assert f"search.{field}: List should have at most {MAX_SEARCH_OPTIONS} items" in problem["detail"]
    assert await _stored_plans(client) == 0


@pytest.mark.anyio
async def test_lists_differing_only_by_duplicates_or_order_store_one_plan(client: httpx.AsyncClient) -> None:
    plain = cheap_plan(search={"shardings": ["full_shard", "no_shard"], "compile": [True, False],
                               "tensor_parallel_degrees": [1, 2]})
    shuffled = cheap_plan(search={
        "shardings": ["no_shard", "full_shard", "no_shard", "full_shard"],
        "compile": _repeated([False, True], MAX_SEARCH_OPTIONS),
        "tensor_parallel_degrees": [2, 1, 2, 2, 1],
    })
    first = await client.post(PLANS, json=plain)
    assert first.status_code == 201, first.text
    again = await client.post(PLANS, json=shuffled)
    assert again.status_code == 200, again.text  # the stored plan, not a new one
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["plan_hash"] == first.json()["plan_hash"]
    assert again.json()["request"]["search"]["shardings"] == ["full_shard", "no_shard"]
    assert again.json()["request"]["search"]["compile"] == [True, False]
    assert await _stored_plans(client) == 1


@pytest.mark.anyio
async def test_the_default_lists_in_another_order_hash_as_the_defaults(client: httpx.AsyncClient) -> None:
    default = await client.post(PLANS, json=CHEAP_PLAN)
    assert default.status_code == 201, default.text
    reordered = cheap_plan(search={
        "shardings": ["no_shard", "hybrid_shard", "shard_grad_op", "full_shard"],
        "checkpointing": ["full", "op_selective", "selective", "none", "full"],
        "pipeline_schedules": ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"],
    })
    again = await client.post(PLANS, json=reordered)
    assert again.status_code == 200, again.text
    assert again.json()["plan_hash"] == default.json()["plan_hash"]


@pytest.mark.anyio
async def test_a_search_space_too_large_to_price_is_refused_before_pricing(client: httpx.AsyncClient) -> None:
    started = time.perf_counter()
    problem = assert_problem(await client.post(PLANS, json=TOO_LARGE), 422, "search-space-too-large")
    assert time.perf_counter() - started < 10  # counted, not searched (a search of it takes minutes)
    assert problem["limit"] == MAX_SEARCH_SPACE and problem["configurations_counted"] > MAX_SEARCH_SPACE
    assert f"{MAX_SEARCH_SPACE:,}" in problem["detail"] and "search.float8" not in problem["detail"]
    assert "Float8 recipes" in problem["detail"]
    assert [error["field"] for error in problem["errors"]] == ["search"]
    assert await _stored_plans(client) == 0


@pytest.mark.anyio
async def test_a_study_with_a_search_list_past_its_cap_is_refused(client: httpx.AsyncClient) -> None:
    body = study(search={"compile": _repeated([True, False], 1000)})
    problem = assert_problem(await client.post(STUDIES, json=body), 422)
    assert "search.compile" in [error["field"] for error in problem["errors"]]
    listed = await client.get(STUDIES)
    assert listed.status_code == 200 and listed.json()["items"] == []
