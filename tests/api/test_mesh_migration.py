"""Migration 0010 on SQLite and PostgreSQL: every stored plan's per-axis columns become its `mesh`
document, the API lists and filters them from it, and a downgrade gives back the very columns.

The plans are stored as each era stored them: plan documents of schema 1.0, 1.2, 2.0 and 2.1 (and one
that no planner can read) through revision 0002, whose columns 0003, 0008 and 0009 backfilled; then
plans of the current schema with pipeline, context and tensor parallelism, written at 0009 with their
columns, as the service wrote them then.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy import inspect
from sqlalchemy.orm import Session

from api.app import create_app
from api.db import migrate
from api.db.models import PlanRow
from api.db.session import create_db_engine
from api.schemas.plans import PlanSort, SortOrder
from api.services.plan_listing import PlanFilters, list_plans
from api.settings import Settings
from contract.mesh import MESH_AXES, Mesh
from migrations import data_loss
from tests.api.test_migrations import _PLANS_0002, _plan_document
from tests.older_schemas import as_schema_1, as_schema_2_0, as_schema_2_1

pytestmark = pytest.mark.anyio

BEFORE = "0009"
AXES_0010 = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The mesh's axes when 0010 made the documents (migrations/versions/0010_plan_mesh_document.py)."""
COLUMNS = {
    "pp": "pipeline_parallel_degree",
    "dp_shard": "data_parallel_shard_degree",
    "cp": "context_parallel_degree",
    "tp": "tensor_parallel_degree",
}
"""The per-axis columns of revision 0009."""
_PLANS_0009 = sa.table("plans", *(sa.column(c.name, c.type) for c in _PLANS_0002.columns),
                       *(sa.column(column) for column in COLUMNS.values() if column not in _PLANS_0002.c))


@pytest.fixture
def engine(backend: str, database_factory: Callable[[str], str]) -> Iterator[sa.Engine]:
    engine = create_db_engine(database_factory(backend))
    yield engine
    engine.dispose()


def _row(name: str, document: dict[str, Any], *, world: int = 4) -> dict[str, Any]:
    return {
        "name": name, "model_name": "llama-debug", "gpu": "cpu", "num_nodes": 1, "gpus_per_node": world,
        "world_size": world, "tokens_per_s_per_gpu": 1.0, "mfu": 0.1, "peak_memory_gib": 1.0,
        "step_time_s": 1.0, "plan_hash": name.encode().hex().ljust(64, "0"), "planner_version": "test",
        "created_at": datetime.now(UTC), "request": {}, "plan": document,
    }


def _with_mesh(document: dict[str, Any], **mesh: int) -> dict[str, Any]:
    config = document["config"]
    return {**document, "config": {**config, "mesh": {**config["mesh"], **mesh}}}


def _store_every_era(engine: sa.Engine) -> None:
    """Plans of every schema version, each stored at the revision its era had; the database left at 0009."""
    data_parallel = _plan_document(tensor_parallel_degrees=[1], shardings=["hybrid_shard"])
    no_shard = _plan_document(tensor_parallel_degrees=[1], shardings=["no_shard"])
    tensor_parallel = _plan_document(tensor_parallel_degrees=[2], shardings=["shard_grad_op"])
    migrate.upgrade(engine, "0002")
    with engine.begin() as connection:
        for name, document in {
            "1.0 hybrid": as_schema_1(data_parallel, "1.0"),
            "1.2 no_shard": as_schema_1(no_shard),
            "1.2 without replica counts": as_schema_1(data_parallel, replica_counts=False),
            "2.0 tp2": as_schema_2_0(tensor_parallel),
            "2.1 tp2": as_schema_2_1(tensor_parallel),
            "unreadable": {"schema_version": "1.0"},
        }.items():
            connection.execute(_PLANS_0002.insert().values(**_row(name, document)))
    migrate.upgrade(engine, BEFORE)  # 0003, 0008 and 0009 backfill their columns from the documents
    pipelined = _with_mesh(data_parallel, pp=2, dp_replicate=1, dp_shard=2)
    pipelined["config"]["pipeline"] = {"schedule": "1F1B", "stages_per_rank": 1, "stage_blocks": [1, 1]}
    with engine.begin() as connection:
        for name, world, mesh in (
            ("2.2 pp2 dp_shard2", 4, {"pp": 2, "dp_shard": 2, "cp": 1, "tp": 1}),
            ("2.2 cp2 tp2", 4, {"pp": 1, "dp_shard": 1, "cp": 2, "tp": 2}),
            ("2.2 pp4 cp2 tp2 x2 replicas", 64, {"pp": 4, "dp_shard": 2, "cp": 2, "tp": 2}),
            ("2.2 tp2", 4, {"pp": 1, "dp_shard": 2, "cp": 1, "tp": 2}),
            ("columns beyond the world", 4, {"pp": 1, "dp_shard": 8, "cp": 1, "tp": 1}),
        ):
            document = pipelined if mesh["pp"] > 1 else _with_mesh(data_parallel, **mesh)
            connection.execute(_PLANS_0009.insert().values(
                **_row(name, document, world=world), sharding="full_shard",
                **{column: mesh[axis] for axis, column in COLUMNS.items()},
            ))


def _reference_a_plan(engine: sa.Engine) -> None:
    """A validation run and an idempotency key of one plan: rebuilding `plans` on SQLite would delete them."""
    with engine.begin() as connection:
        plan_id = connection.execute(sa.text("SELECT min(id) FROM plans")).scalar_one()
        connection.execute(sa.text(
            "INSERT INTO idempotency_keys (key, request_fingerprint, plan_id, status_code, created_at) "
            "VALUES ('k', 'f', :id, 201, :now)"
        ), {"id": plan_id, "now": datetime.now(UTC)})
        connection.execute(sa.text(
            "INSERT INTO validation_runs (plan_id, outcome, predicted_step_time_s, "
            "predicted_tokens_per_s_per_gpu, predicted_peak_memory_gib, raw, created_at) "
            "VALUES (:id, 'oom', 1.0, 1.0, 1.0, '{}', :now)"
        ), {"id": plan_id, "now": datetime.now(UTC)})


def _references(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        return tuple(connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
                     for table in ("idempotency_keys", "validation_runs"))


def _snapshot(engine: sa.Engine) -> tuple[dict[str, Any], dict[str, tuple[str, bool, Any]]]:
    """Every plan row as stored (every column, by name), and the plans table's columns."""
    with engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT * FROM plans")).mappings()
        rows = {row["name"]: dict(row) for row in stored}
        columns = {c["name"]: (str(c["type"]), c["nullable"], c["default"])
                   for c in inspect(connection).get_columns("plans")}
    return rows, columns


def _query_plan(engine: sa.Engine, filters: PlanFilters) -> str:
    """How the database answers a list query with `filters` (PostgreSQL: an index scan wherever one can
    serve, as on a table large enough to make it the cheapest)."""
    query = sa.select(PlanRow.id).where(*filters.conditions())
    sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.begin() as connection:
        if engine.dialect.name == "sqlite":
            return str(connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}").all())
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
        return str(connection.exec_driver_sql(f"EXPLAIN {sql}").all())


def _expected_mesh(row: dict[str, Any]) -> dict[str, int]:
    """What 0010 must write for a row of 0009: its columns, and dp_replicate as the API showed it (the
    axes of 0010; one added later, ep, is absent: it reads 1)."""
    degrees = {axis: row[column] for axis, column in COLUMNS.items()}
    others = degrees["pp"] * degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    return {axis: degrees.get(axis, max(1, row["world_size"] // others)) for axis in AXES_0010}


async def test_0010_moves_every_mesh_into_one_document_and_back(engine: sa.Engine) -> None:
    _store_every_era(engine)
    _reference_a_plan(engine)
    before, before_columns = _snapshot(engine)
    assert len(before) == 11
    assert {name for name, row in before.items() if row["pipeline_parallel_degree"] > 1} == {
        "2.2 pp2 dp_shard2", "2.2 pp4 cp2 tp2 x2 replicas"}
    expected = {name: _expected_mesh(row) for name, row in before.items()}
    assert expected["1.0 hybrid"] == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 1}
    assert expected["2.2 pp4 cp2 tp2 x2 replicas"]["dp_replicate"] == 2

    migrate.upgrade(engine)
    after, after_columns = _snapshot(engine)
    assert not set(COLUMNS.values()) & set(after_columns)
    assert not after_columns["mesh"][1]  # NOT NULL
    assert _references(engine) == (1, 1)  # dropping the columns rebuilt nothing (SQLite): nothing cascaded
    for axis in MESH_AXES:  # each axis has its index, and a filter on it is answered through it
        assert f"ix_plans_mesh_{axis}" in _query_plan(engine, PlanFilters(**{axis: 2})), axis
    for name, row in after.items():
        mesh = row["mesh"] if isinstance(row["mesh"], dict) else json.loads(row["mesh"])  # SQLite: text
        assert mesh == expected[name], name
        # Every other column is as it was.
        assert {k: v for k, v in row.items() if k != "mesh"} == {
            k: v for k, v in before[name].items() if k not in COLUMNS.values()}, name

    await _check_the_api_lists_and_filters(engine, expected, {name: row["id"] for name, row in after.items()})

    migrate.downgrade(engine, BEFORE)
    assert _snapshot(engine) == (before, before_columns)  # the very columns and values, nothing lost
    assert _references(engine) == (1, 1)
    migrate.upgrade(engine)  # and up again: the same documents
    assert {name: row["mesh"] for name, row in _snapshot(engine)[0].items()} == {
        name: row["mesh"] for name, row in after.items()}


async def _check_the_api_lists_and_filters(
    engine: sa.Engine, expected: dict[str, dict[str, int]], ids: dict[str, int]
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    app = create_app(Settings(database_url=url, migrate_on_startup=False))
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            items = (await client.get("/api/v1/plans", params={"limit": 200})).json()["items"]
            shown = {name: Mesh.from_document(mesh).as_document() for name, mesh in expected.items()}
            assert {item["name"]: item["mesh"] for item in items} == shown  # axes added since read 1
            for axis, degree in (("tp", 2), ("tp", 1), ("pp", 2), ("pp", 4), ("pp", 1), ("cp", 2)):
                listed = (await client.get("/api/v1/plans", params={axis: degree, "limit": 200})).json()
                assert {item["name"] for item in listed["items"]} == {
                    name for name, mesh in expected.items() if mesh[axis] == degree}, (axis, degree)
            for name in ("1.0 hybrid", "2.0 tp2", "2.2 pp4 cp2 tp2 x2 replicas"):
                detail = (await client.get(f"/api/v1/plans/{ids[name]}")).json()
                assert detail["mesh"] == shown[name]
        # The service filters on every axis (the data-parallel ones too), several at once.
        with Session(app.state.engine) as session:
            for degrees in ({"cp": 2}, {"dp_replicate": 2}, {"cp": 2, "tp": 2, "pp": 1}, {"dp_shard": 8}):
                rows, _ = list_plans(session, filters=PlanFilters(**degrees), sort=PlanSort.created_at,
                                     order=SortOrder.desc, limit=200, cursor=None)
                assert {row.name for row in rows} == {
                    name for name, mesh in expected.items()
                    if all(mesh[axis] == degree for axis, degree in degrees.items())}, degrees
    finally:
        app.state.jobs.shutdown()
        app.state.plan_jobs.shutdown()
        app.state.search_pool.shutdown()
        app.state.engine.dispose()


def test_a_downgrade_that_would_lose_a_degree_is_refused_unless_forced(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later planner's axis (here `ep`), or a dp_replicate the world size does not give, has no column
    at 0009: counted, refused with nothing changed, and dropped only when forced."""
    monkeypatch.delenv(data_loss.FORCE_ENV, raising=False)
    migrate.upgrade(engine)
    plain = {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}
    meshes = {"plain": plain, "ep2": {**plain, "dp_shard": 2, "ep": 2}, "ep1": {**plain, "ep": 1},
              "two replicas of 4": {**plain, "dp_replicate": 2}}
    with engine.begin() as connection:
        for name, mesh in meshes.items():
            connection.execute(PlanRow.__table__.insert().values(**_row(name, {}), sharding="full_shard",
                                                                 mesh=mesh))
    with pytest.raises(data_loss.DataLossRefusedError) as refused:
        migrate.downgrade(engine, BEFORE)
    message = str(refused.value)
    assert "1 row of plans' degrees above 1 on axes other than pp, dp_replicate, dp_shard, cp, tp" in message
    # ep2's 2 replicas of 2 shards are 4 GPUs: 0009 would read dp_replicate 2 from the world size.
    assert "2 rows of plans' dp_replicate degrees that their world size does not give" in message
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert "mesh" in _snapshot(engine)[1]

    monkeypatch.setenv(data_loss.FORCE_ENV, "1")
    migrate.downgrade(engine, BEFORE)
    rows, _ = _snapshot(engine)
    assert {name: tuple(row[column] for column in COLUMNS.values()) for name, row in rows.items()} == {
        "plain": (1, 4, 1, 1), "ep2": (1, 2, 1, 1), "ep1": (1, 4, 1, 1), "two replicas of 4": (1, 4, 1, 1)}
