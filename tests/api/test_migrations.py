"""Alembic: upgrade, downgrade and upgrade again on a fresh database; the models match the migrations."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from api.app import create_app
from api.db import migrate
from api.db.base import Base
from api.db.session import create_db_engine
from api.settings import Settings

TABLES = {"plans", "calibration_profiles", "validation_runs", "api_keys", "idempotency_keys"}


@pytest.fixture
def fresh_url(backend: str, database_factory: Callable[[str], str]) -> str:
    return database_factory(backend)


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    engine = create_db_engine(fresh_url)
    try:
        assert migrate.current_revision(engine) is None
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision() == "0002"
        assert set(inspect(engine).get_table_names()) >= TABLES

        migrate.downgrade(engine, "base")
        assert migrate.current_revision(engine) is None
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}

        migrate.upgrade(engine)
        migrate.upgrade(engine)  # a no-op at head
        assert migrate.current_revision(engine) == "0002"
        assert set(inspect(engine).get_table_names()) >= TABLES
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
            assert (await client.get("/readyz")).json()["schema_revision"] == "0002"
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
