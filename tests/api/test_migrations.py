"""Alembic: upgrade, downgrade and upgrade again on a fresh database; the models match the migrations."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from api.app import create_app
from api.db import migrate
from api.db.base import Base, JsonDocument, UTCDateTime
from api.db.session import create_db_engine
from api.settings import Settings
from planner.catalog import resolve_model
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec

TABLES = {"plans", "calibration_profiles", "validation_runs", "api_keys", "idempotency_keys"}
MESH_COLUMNS = ("sharding", "tensor_parallel_degree", "data_parallel_shard_degree")


@pytest.fixture
def fresh_url(backend: str, database_factory: Callable[[str], str]) -> str:
    return database_factory(backend)


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    engine = create_db_engine(fresh_url)
    try:
        assert migrate.current_revision(engine) is None
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision() == "0004"
        assert set(inspect(engine).get_table_names()) >= TABLES

        migrate.downgrade(engine, "base")
        assert migrate.current_revision(engine) is None
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}

        migrate.upgrade(engine)
        migrate.upgrade(engine)  # a no-op at head
        assert migrate.current_revision(engine) == "0004"
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def _plan_document(**search: object) -> dict[str, Any]:
    """A real plan of llama-debug on 4 CPU ranks, searched with `search`'s pins, as stored JSON."""
    request = PlanRequest(
        model=resolve_model("llama-debug"), cluster=ClusterSpec.parse("1x4xcpu"),
        training=TrainingSpec(seq_len=128, global_batch_tokens=128 * 16), search=SearchSpace(**search),
    )
    return make_plan(request).model_dump(mode="json")


def _as_schema_1(document: dict[str, Any]) -> dict[str, Any]:
    """A 2.0 data-parallel plan written as schema 1.2 did: no mesh, the two group sizes apart."""
    def config_1(config: dict[str, Any]) -> dict[str, Any]:
        config = dict(config)
        mesh = config.pop("mesh")
        assert mesh["tp"] == 1
        return {**config, "shard_group_size": mesh["dp_shard"], "replicate_group_size": mesh["dp_replicate"]}

    return {
        **document, "schema_version": "1.2", "config": config_1(document["config"]),
        "alternatives": [{**c, "config": config_1(c["config"])} for c in document["alternatives"]],
        "pareto_front": [{**c, "config": config_1(c["config"])} for c in document["pareto_front"]],
    }


# The plans table as revision 0002 left it (the model has moved on).
_PLANS_0002 = sa.table(
    "plans", *(sa.column(name) for name in (
        "name", "model_name", "gpu", "num_nodes", "gpus_per_node", "world_size", "tokens_per_s_per_gpu",
        "mfu", "peak_memory_gib", "step_time_s", "plan_hash", "planner_version",
    )),
    sa.column("created_at", UTCDateTime), sa.column("request", JsonDocument), sa.column("plan", JsonDocument),
)


def test_0003_backfills_the_mesh_from_2_0_and_1_x_plans_and_reverts(fresh_url: str) -> None:
    tensor_parallel = _plan_document(tensor_parallel_degrees=[2], shardings=["shard_grad_op"])
    hybrid_1x = _as_schema_1(_plan_document(tensor_parallel_degrees=[1], shardings=["hybrid_shard"]))
    no_shard_1x = _as_schema_1(_plan_document(tensor_parallel_degrees=[1], shardings=["no_shard"]))
    documents = {"tp2": tensor_parallel, "hybrid-1.x": hybrid_1x, "no_shard-1.x": no_shard_1x,
                 "unreadable": {"schema_version": "1.0"}}
    # What the planner reads back from each (the backfill must agree with it).
    expected = {
        "tp2": ("shard_grad_op", 1, 2, 2),
        "hybrid-1.x": ("hybrid_shard", 2, 2, 1),
        "no_shard-1.x": ("no_shard", 4, 1, 1),
        "unreadable": ("unknown", None, 1, 1),
    }
    for key in ("tp2", "hybrid-1.x", "no_shard-1.x"):
        mesh = Plan.model_validate(documents[key]).config.mesh
        assert expected[key][1:] == (mesh.dp_replicate, mesh.dp_shard, mesh.tp), key

    engine = create_db_engine(fresh_url)
    try:
        migrate.upgrade(engine, "0002")
        with engine.begin() as connection:
            for i, (key, document) in enumerate(documents.items()):
                connection.execute(_PLANS_0002.insert().values(
                    name=key, model_name="llama-debug", gpu="cpu", num_nodes=1, gpus_per_node=4, world_size=4,
                    tokens_per_s_per_gpu=1.0, mfu=0.1, peak_memory_gib=1.0, step_time_s=1.0,
                    plan_hash=f"{i:064x}", planner_version="test", created_at=datetime.now(UTC),
                    request={}, plan=document,
                ))
            plan_id = connection.execute(sa.text("SELECT id FROM plans WHERE name = 'tp2'")).scalar_one()
            connection.execute(sa.text(
                "INSERT INTO idempotency_keys (key, request_fingerprint, plan_id, status_code, created_at) "
                "VALUES ('k', 'f', :id, 201, :now)"
            ), {"id": plan_id, "now": datetime.now(UTC)})

        migrate.upgrade(engine)
        with engine.connect() as connection:
            stored = {
                name: (sharding, dp_shard, tp)
                for name, sharding, dp_shard, tp in connection.execute(sa.text(
                    "SELECT name, sharding, data_parallel_shard_degree, tensor_parallel_degree FROM plans"
                ))
            }
            # Adding the columns rebuilt nothing: what references plans is still there.
            assert connection.execute(sa.text("SELECT count(*) FROM idempotency_keys")).scalar_one() == 1
        assert stored == {key: (row[0], row[2], row[3]) for key, row in expected.items()}
        with engine.connect() as connection:
            columns = {c["name"]: c for c in inspect(connection).get_columns("plans")}
        assert not any(columns[name]["nullable"] for name in MESH_COLUMNS)

        migrate.downgrade(engine, "0002")
        with engine.connect() as connection:
            assert not set(MESH_COLUMNS) & {c["name"] for c in inspect(connection).get_columns("plans")}
            assert connection.execute(sa.text("SELECT count(*) FROM plans")).scalar_one() == len(documents)
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == "0004"
    finally:
        engine.dispose()


def test_models_match_the_migrations(database_url: str) -> None:
    """What `alembic check` does: a model change without a migration fails here."""
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_constraints_are_named_by_the_convention(database_url: str) -> None:
    engine = create_db_engine(database_url)
    try:
        inspector = inspect(engine)
        assert {u["name"] for u in inspector.get_unique_constraints("plans")} == {"uq_plans_plan_hash"}
        assert {f["name"] for f in inspector.get_foreign_keys("validation_runs")} == {
            "fk_validation_runs_plan_id_plans"
        }
        assert inspector.get_pk_constraint("plans")["name"] in ("pk_plans", None)  # SQLite does not name PKs
    finally:
        engine.dispose()


@pytest.mark.anyio
async def test_the_app_migrates_a_fresh_database_at_startup(fresh_url: str, anyio_backend: str) -> None:
    app = create_app(Settings(database_url=fresh_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/readyz")).json()["schema_revision"] == "0004"
            body = {
                "model": "llama-debug",
                "cluster": "1x2xcpu",
                "training": {"seq_len": 128, "global_batch_tokens": 1024},
            }
            assert (await client.post("/api/v1/plans", json=body)).status_code == 201


def test_default_database_is_a_sqlite_file_in_the_data_dir(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("FSDP_PLANNER_DATABASE_URL", raising=False)
    settings = Settings(data_dir=tmp_path / "nested" / "data")
    url = settings.resolved_database_url
    assert url == f"sqlite:///{tmp_path / 'nested' / 'data' / 'fsdp-planner.sqlite3'}"
    assert (tmp_path / "nested" / "data").is_dir()  # created on first use
    engine = create_db_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_database_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db:5432/plans")
    assert Settings().resolved_database_url == "postgresql+psycopg://u:p@db:5432/plans"
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@db/plans")
    assert Settings().database_url == "postgresql+psycopg://u@db/plans"
    monkeypatch.setenv("DATABASE_URL", "sqlite:////srv/plans.sqlite3")
    assert Settings().resolved_database_url == "sqlite:////srv/plans.sqlite3"
    monkeypatch.setenv("FSDP_PLANNER_MAX_BODY_BYTES", "2048")
    assert Settings().max_body_bytes == 2048
