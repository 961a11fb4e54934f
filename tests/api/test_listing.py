"""GET /plans: keyset pagination over every sort and order, filters, and refused cursors."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from itertools import product
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from api.services.plan_listing import PlanFilters
from contract.mesh import Mesh
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"
SORT_KEYS = {
    "created_at": "created_at",
    "tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
    "mfu": "mfu",
    "peak_memory_gib": "peak_memory_gib",
    "world_size": "world_size",
    "model": "model_name",
}


@pytest.fixture
async def stored(client: httpx.AsyncClient, session: Session) -> list[PlanRow]:
    """One real plan plus 29 clones with varied columns, including ties on every sort column."""
    template = (await client.post(PLANS, json=cheap_plan())).json()
    base = datetime(2026, 1, 1, tzinfo=UTC)
    models = ["llama3-8b", "gpt2", "Llama-Debug"]
    gpus = ["H100-SXM-80GB", "A100-80GB"]
    shardings = ["full_shard", "hybrid_shard", "no_shard", "shard_grad_op"]
    for i in range(29):
        nodes = (1, 2, 4)[i % 3]
        tp = (1, 2, 8)[i // 3 % 3]
        session.add(
            PlanRow(
                name=["prod 50%_off run", "nightly", "ablation_a"][i % 3] + f" #{i}",
                model_name=models[i % 3 if i % 5 else 1],
                gpu=gpus[i % 2],
                num_nodes=nodes,
                gpus_per_node=8,
                world_size=nodes * 8,
                sharding=shardings[i % 4],
                mesh=_mesh(world=nodes * 8, tp=tp, hybrid=shardings[i % 4] == "hybrid_shard"),
                tokens_per_s_per_gpu=float(1000 + (i % 7) * 250),  # ties
                mfu=round(0.3 + (i % 4) * 0.05, 2),
                peak_memory_gib=float(20 + (i * 7) % 11),
                step_time_s=1.0 + i,
                plan_hash=f"{i:064x}",
                planner_version="test",
                request=template["request"],
                plan=template["plan"],
                created_at=base + timedelta(minutes=i // 2),  # pairs share a timestamp
            )
        )
    session.commit()
    return list(session.scalars(select(PlanRow)))


def _mesh(*, world: int, tp: int, pp: int = 1, hybrid: bool) -> dict[str, int]:
    """A stored mesh that tiles `world` GPUs: dp_shard 2 across the replicas for hybrid_shard."""
    dp_shard = 2 if hybrid else world // (pp * tp)
    return Mesh(pp=pp, dp_replicate=world // (pp * dp_shard * tp), dp_shard=dp_shard, tp=tp).as_document()


def expected_ids(rows: list[PlanRow], sort: str, order: str, keep: Any = lambda row: True) -> list[int]:
    column = SORT_KEYS[sort]
    ordered = sorted((r for r in rows if keep(r)), key=lambda r: (getattr(r, column), r.id))
    if order == "desc":
        ordered.reverse()
    return [r.id for r in ordered]


async def walk(client: httpx.AsyncClient, **params: Any) -> list[int]:
    """Ids of every page, following next_cursor (and checking the Link header says the same)."""
    ids: list[int] = []
    cursor = None
    for _ in range(100):
        response = await client.get(PLANS, params={**params, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["items"]) <= params.get("limit", 50)
        ids += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            assert "link" not in response.headers
            return ids
        assert response.headers["link"].endswith('rel="next"') and cursor in response.headers["link"]
    raise AssertionError("pagination did not end")


@pytest.mark.parametrize(("sort", "order"), list(product(SORT_KEYS, ["asc", "desc"])))
async def test_every_sort_pages_through_each_plan_once_in_order(
    client: httpx.AsyncClient, stored: list[PlanRow], sort: str, order: str
) -> None:
    ids = await walk(client, sort=sort, order=order, limit=4)
    assert ids == expected_ids(stored, sort, order)
    assert len(ids) == len(set(ids)) == 30


async def test_default_is_newest_first(client: httpx.AsyncClient, stored: list[PlanRow]) -> None:
    page = (await client.get(PLANS)).json()
    assert [item["id"] for item in page["items"]] == expected_ids(stored, "created_at", "desc")
    assert page["next_cursor"] is None
    assert "plan" not in page["items"][0]  # lists carry the summary, not the document


async def test_filters(client: httpx.AsyncClient, stored: list[PlanRow]) -> None:
    ids = await walk(client, model="llama-debug", sort="mfu", limit=3)  # case-insensitive
    assert ids == expected_ids(stored, "mfu", "desc", lambda r: r.model_name.lower() == "llama-debug")
    assert ids

    ids = await walk(client, gpu="H100", limit=5)  # an alias finds the catalog name
    assert ids == expected_ids(stored, "created_at", "desc", lambda r: r.gpu == "H100-SXM-80GB")
    assert ids

    ids = await walk(client, nodes=2, gpu="a100-80gb", sort="peak_memory_gib", order="asc", limit=2)
    assert ids == expected_ids(
        stored, "peak_memory_gib", "asc", lambda r: r.num_nodes == 2 and r.gpu == "A100-80GB"
    )
    assert ids

    # `q` is a literal substring: % and _ are not wildcards.
    ids = await walk(client, q="50%_OFF")
    assert ids == expected_ids(stored, "created_at", "desc", lambda r: "50%_off" in r.name)
    assert len(ids) == 10
    assert await walk(client, q="%") == expected_ids(stored, "created_at", "desc", lambda r: "%" in r.name)
    assert await walk(client, q="a_a") == []
    assert await walk(client, model="no-such-model") == []


async def test_filters_on_the_mesh(client: httpx.AsyncClient, stored: list[PlanRow]) -> None:
    ids = await walk(client, tp=8, limit=3)
    assert ids == expected_ids(stored, "created_at", "desc", lambda r: r.mesh["tp"] == 8)
    assert len(ids) >= 3

    ids = await walk(client, sharding="hybrid_shard", tp=2, sort="mfu", order="asc", limit=2)
    assert ids == expected_ids(
        stored, "mfu", "asc", lambda r: r.sharding == "hybrid_shard" and r.mesh["tp"] == 2
    )
    assert ids

    # The real plan stored its own mesh, and is found by it.
    real = next(r for r in stored if r.planner_version != "test")
    config = real.plan["config"]
    assert (real.sharding, real.mesh) == (config["sharding"], config["mesh"])
    assert real.id in await walk(client, tp=real.mesh["tp"], sharding=real.sharding)
    assert await walk(client, tp=4) == []

    # Every item says its sharding and mesh; dp_replicate is what the world size leaves.
    items = (await client.get(PLANS, params={"limit": 200})).json()["items"]
    by_id = {r.id: r for r in stored}
    for item in items:
        row = by_id[item["id"]]
        mesh = item["mesh"]
        assert item["sharding"] == row.sharding
        assert "tensor_parallel_degree" not in item  # the mesh says it; lists no longer repeat tp
        assert mesh == row.mesh
        assert mesh["dp_replicate"] * mesh["dp_shard"] * mesh["tp"] == row.world_size
    hybrid = next(i for i in items if i["sharding"] == "hybrid_shard" and i["world_size"] == 32 and
                  i["mesh"]["tp"] == 2)
    assert hybrid["mesh"] == {"pp": 1, "dp_replicate": 8, "dp_shard": 2, "ep": 1, "cp": 1, "tp": 2}

    # A cursor is bound to its mesh filters too.
    cursor = (await client.get(PLANS, params={"limit": 2, "tp": 1})).json()["next_cursor"]
    assert cursor is not None
    assert_problem(await client.get(PLANS, params={"cursor": cursor, "tp": 2}), 422, "invalid-cursor")


async def test_filters_on_the_pipeline_degree(
    client: httpx.AsyncClient, stored: list[PlanRow], session: Session
) -> None:
    """pp is stored per plan: lists filter on it, and the mesh they show divides the world by it."""
    staged = [r for r in stored if r.planner_version == "test"][:6]  # clones of 8 to 32 GPUs
    for i, row in enumerate(staged):
        # Columns that tile the world: pp x dp_shard (x dp_replicate for hybrid_shard) x tp.
        row.sharding = "hybrid_shard" if i < 2 else "full_shard"
        row.mesh = _mesh(world=row.world_size, tp=1, pp=(2, 4)[i % 2], hybrid=i < 2)
    session.commit()
    assert await walk(client, pp=2, limit=2) == expected_ids(
        stored, "created_at", "desc", lambda r: r.mesh["pp"] == 2
    )
    assert await walk(client, pp=1) == expected_ids(stored, "created_at", "desc", lambda r: r not in staged)
    assert await walk(client, pp=8) == []
    assert await walk(client, pp=4, sharding="hybrid_shard") == [staged[1].id]
    items = {i["id"]: i for i in (await client.get(PLANS, params={"limit": 200})).json()["items"]}
    for row in staged:
        mesh, world = items[row.id]["mesh"], row.world_size
        assert mesh == row.mesh
        assert mesh["dp_replicate"] == (world // (2 * mesh["pp"]) if row.sharding == "hybrid_shard" else 1)
        assert mesh["pp"] * mesh["dp_replicate"] * mesh["dp_shard"] * mesh["cp"] * mesh["tp"] == world
    # A cursor is bound to the pp filter too.
    cursor = (await client.get(PLANS, params={"limit": 1, "pp": 2})).json()["next_cursor"]
    assert_problem(await client.get(PLANS, params={"cursor": cursor, "pp": 4}), 422, "invalid-cursor")


async def test_new_rows_do_not_shift_pages(client: httpx.AsyncClient, stored: list[PlanRow]) -> None:
    first = (await client.get(PLANS, params={"limit": 10, "sort": "created_at", "order": "asc"})).json()
    await client.post(PLANS, json=cheap_plan(top_k=3))  # newest: sorts last
    rest = await walk(client, limit=10, sort="created_at", order="asc", cursor=first["next_cursor"])
    ids = [item["id"] for item in first["items"]] + rest
    assert ids[:30] == expected_ids(stored, "created_at", "asc")
    assert len(ids) == 31 == len(set(ids))


async def test_bad_cursors_are_refused(client: httpx.AsyncClient, stored: list[PlanRow]) -> None:
    cursor = (await client.get(PLANS, params={"limit": 2, "sort": "mfu"})).json()["next_cursor"]
    for params in ({"sort": "world_size"}, {"sort": "mfu", "order": "asc"}, {"sort": "mfu", "nodes": 1}):
        problem = assert_problem(
            await client.get(PLANS, params={"cursor": cursor, **params}), 422, "invalid-cursor"
        )
        assert "start again without `cursor`" in problem["detail"]
        assert problem["errors"][0]["field"] == "cursor"

    def forge(payload: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")

    good = {"s": "mfu", "o": "desc", "f": PlanFilters().digest(), "v": 0.3, "i": 1}
    assert (await client.get(PLANS, params={"cursor": forge(good), "sort": "mfu"})).status_code == 200
    forged = [
        "AAAA",
        "-_-_",
        forge([1, 2]),
        forge({"s": "mfu"}),
        forge({**good, "i": "1"}),
        forge({**good, "i": 2**70}),
        forge({**good, "v": "x"}),
        forge({**good, "v": True}),
        forge({**good, "i": -1}),
        forge({**good, "v": None}),
        forge({**good, "v": float("nan")}),  # json.dumps writes NaN
        forge({**good, "s": "created_at", "v": "2026-01-01T00:00:00"}),  # naive timestamp
    ]
    # Not even the cursor alphabet: refused by the query parameter's pattern.
    assert_problem(await client.get(PLANS, params={"cursor": "not base64!"}), 422, "invalid-request")
    for bad in forged:
        params = {"cursor": bad, "sort": "created_at" if "created_at" in str(bad) else "mfu"}
        assert_problem(await client.get(PLANS, params=params), 422, "invalid-cursor")


async def test_an_empty_cursor_is_the_first_page(client: httpx.AsyncClient, stored: list[PlanRow]) -> None:
    """The parameter's pattern allows the empty string; it means what no cursor means."""
    first = await client.get(PLANS, params={"limit": 4, "sort": "mfu"})
    empty = await client.get(PLANS, params={"limit": 4, "sort": "mfu", "cursor": ""})
    assert empty.status_code == 200, empty.text
    assert empty.json() == first.json() and empty.json()["next_cursor"] is not None
    assert (await client.get(f"{PLANS}?cursor=")).json()["items"] == (await client.get(PLANS)).json()["items"]


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 201},
        {"sort": "name"},
        {"order": "up"},
        {"nodes": 0},
        {"nodes": "x"},
        {"q": "x" * 201},
        {"tp": 0},
        {"tp": 1025},
        {"tp": "two"},
        {"pp": 0},
        {"pp": 1025},
        {"pp": "two"},
        {"pp": "\u0663"},  # Arabic-Indic three: int() would read it, the API must not
        {"pp": "\u00b2"},  # superscript two: str.isdigit() says yes, int() refuses
        {"pp": "2.5"},
        {"cp": 0},
        {"cp": 1025},
        {"sharding": "zero3"},
        {"sharding": "FULL_SHARD"},
    ],
)
async def test_bad_query_parameters_are_422(client: httpx.AsyncClient, params: dict[str, Any]) -> None:
    problem = assert_problem(await client.get(PLANS, params=params), 422, "invalid-request")
    assert problem["errors"][0]["location"] == "query"
    assert problem["errors"][0]["field"] == next(iter(params))
    if "sharding" in params:  # the message names what is accepted
        assert "hybrid_shard" in problem["detail"], problem
