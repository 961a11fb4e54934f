"""Alembic: upgrade, downgrade and upgrade again on a fresh database; the models match the migrations;
downgrades that would delete rows refuse unless forced."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
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
from migrations import data_loss
from planner.catalog.models import resolve_model
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.live_server import REPO_ROOT
from tests.older_schemas import as_schema_1

TABLES = {"plans", "calibration_profiles", "validation_runs", "api_keys", "idempotency_keys"}
HEAD = "0011"
MESH_COLUMNS = ("sharding", "tensor_parallel_degree", "data_parallel_shard_degree")


@pytest.fixture
def fresh_url(backend: str, database_factory: Callable[[str], str]) -> str:
    return database_factory(backend)


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    engine = create_db_engine(fresh_url)
    try:
        assert migrate.current_revision(engine) is None
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision() == HEAD
        assert set(inspect(engine).get_table_names()) >= TABLES

        migrate.downgrade(engine, "base")
        assert migrate.current_revision(engine) is None
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}

        migrate.upgrade(engine)
        migrate.upgrade(engine)  # a no-op at head
        assert migrate.current_revision(engine) == HEAD
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


# The plans table as revision 0002 left it (the model has moved on).
_PLANS_0002 = sa.table(
    "plans", *(sa.column(name) for name in (
        "sharding", "tensor_parallel_degree", "data_parallel_shard_degree",  # from 0003 on (optional here)
        "name", "model_name", "gpu", "num_nodes", "gpus_per_node", "world_size", "tokens_per_s_per_gpu",
        "mfu", "peak_memory_gib", "step_time_s", "plan_hash", "planner_version",
    )),
    sa.column("created_at", UTCDateTime), sa.column("request", JsonDocument), sa.column("plan", JsonDocument),
)


def test_0003_backfills_the_mesh_from_2_0_and_1_x_plans_and_reverts(fresh_url: str) -> None:
    tensor_parallel = _plan_document(tensor_parallel_degrees=[2], shardings=["shard_grad_op"])
    hybrid_1x = as_schema_1(_plan_document(tensor_parallel_degrees=[1], shardings=["hybrid_shard"]))
    no_shard_1x = as_schema_1(_plan_document(tensor_parallel_degrees=[1], shardings=["no_shard"]))
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

        migrate.upgrade(engine, "0003")
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
        assert migrate.current_revision(engine) == HEAD
    finally:
        engine.dispose()


def test_0008_backfills_the_context_parallel_degree_and_reverts(fresh_url: str) -> None:
    plain = _plan_document(tensor_parallel_degrees=[1], shardings=["full_shard"])
    mesh = plain["config"]["mesh"]
    split = {**plain, "config": {**plain["config"], "mesh": {**mesh, "cp": 2, "dp_shard": 2}}}
    engine = create_db_engine(fresh_url)
    try:
        migrate.upgrade(engine, "0007")
        with engine.begin() as connection:
            for i, (key, document) in enumerate({"cp1": plain, "cp2": split, "before-cp": {
                **plain, "config": {**plain["config"], "mesh": {"dp_replicate": 1, "dp_shard": 4, "tp": 1}}
            }}.items()):
                connection.execute(_PLANS_0002.insert().values(
                    name=key, model_name="llama-debug", gpu="cpu", num_nodes=1, gpus_per_node=4, world_size=4,
                    tokens_per_s_per_gpu=1.0, mfu=0.1, peak_memory_gib=1.0, step_time_s=1.0,
                    plan_hash=f"{i:064x}", planner_version="test", created_at=datetime.now(UTC),
                    request={}, plan=document, sharding="full_shard", tensor_parallel_degree=1,
                    data_parallel_shard_degree=document["config"]["mesh"]["dp_shard"],
                ))
        migrate.upgrade(engine, "0008")
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT name, context_parallel_degree FROM plans"))
            stored = dict(rows.all())
        assert stored == {"cp1": 1, "cp2": 2, "before-cp": 1}
        migrate.downgrade(engine, "0007")
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("plans")}
            assert "context_parallel_degree" not in columns
            assert connection.execute(sa.text("SELECT count(*) FROM plans")).scalar_one() == 3
    finally:
        engine.dispose()


# The plans table as revision 0008 left it (PostgreSQL keeps no default for context_parallel_degree).
_PLANS_0008 = sa.table(
    "plans", *(sa.column(c.name, c.type) for c in _PLANS_0002.columns), sa.column("context_parallel_degree")
)


def test_0009_backfills_the_pipeline_parallel_degree_and_reverts(fresh_url: str) -> None:
    """Runs on SQLite and PostgreSQL (the `backend` parameter): the backfill reads the JSON documents
    in SQL, which each dialect spells its own way."""
    plain = _plan_document(tensor_parallel_degrees=[1], shardings=["full_shard"])
    config = plain["config"]
    pipelined = {**plain, "config": {
        **config, "mesh": {**config["mesh"], "pp": 2, "dp_shard": 2},
        "pipeline": {"schedule": "1F1B", "stages_per_rank": 1, "stage_blocks": [1, 1]},
    }}
    before_pp = {**plain, "config": {**config, "mesh": {"dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}}}
    engine = create_db_engine(fresh_url)
    try:
        migrate.upgrade(engine, "0008")
        with engine.begin() as connection:
            documents = {"pp1": plain, "pp2": pipelined, "before-pp": before_pp}
            for i, (key, document) in enumerate(documents.items()):
                connection.execute(_PLANS_0008.insert().values(
                    name=key, model_name="llama-debug", gpu="cpu", num_nodes=1, gpus_per_node=4, world_size=4,
                    tokens_per_s_per_gpu=1.0, mfu=0.1, peak_memory_gib=1.0, step_time_s=1.0,
                    plan_hash=f"{i:064x}", planner_version="test", created_at=datetime.now(UTC),
                    request={}, plan=document, sharding="full_shard", tensor_parallel_degree=1,
                    data_parallel_shard_degree=document["config"]["mesh"]["dp_shard"],
                    context_parallel_degree=1,
                ))
        migrate.upgrade(engine, "0009")
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT name, pipeline_parallel_degree FROM plans"))
            assert dict(rows.all()) == {"pp1": 1, "pp2": 2, "before-pp": 1}
        migrate.downgrade(engine, "0008")
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("plans")}
            assert "pipeline_parallel_degree" not in columns and "context_parallel_degree" in columns
            kept = connection.execute(sa.text("SELECT name, data_parallel_shard_degree FROM plans"))
            assert dict(kept.all()) == {"pp1": 4, "pp2": 2, "before-pp": 4}
        migrate.upgrade(engine, "0009")  # and back up: the backfill runs again from the documents
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT name, pipeline_parallel_degree FROM plans"))
            assert dict(rows.all()) == {"pp1": 1, "pp2": 2, "before-pp": 1}
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
            assert (await client.get("/readyz")).json()["schema_revision"] == HEAD
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


# Downgrades that would delete rows: refused (nothing changes) unless forced, with the count of each loss.

_RUNS_0002 = sa.table(
    "validation_runs", *(sa.column(name) for name in (
        "plan_id", "outcome", "predicted_step_time_s", "predicted_tokens_per_s_per_gpu",
        "predicted_peak_memory_gib", "oom_step", "oom_message",
    )),
    sa.column("created_at", UTCDateTime), sa.column("raw", JsonDocument),
)
_STUDIES = sa.table(
    "studies", *(sa.column(name) for name in (
        "name", "model_name", "token_budget", "gpus", "num_candidates", "num_fitting", "planner_version",
    )),
    sa.column("created_at", UTCDateTime), sa.column("request", JsonDocument),
    sa.column("summary", JsonDocument),
)
_STUDIES_0005 = sa.table(
    "studies", *(sa.column(c.name, c.type) for c in _STUDIES.columns), sa.column("state"),
    sa.column("candidates_done"), sa.column("attempts"),
)


STUDY_LOSS = r"1 row of studies \(downgrade of 0004\); {points} rows of study points"


def _store_plan(connection: sa.Connection, name: str) -> int:
    """A plan row at revision 0002 (its document is never read here)."""
    connection.execute(_PLANS_0002.insert().values(
        name=name, model_name="llama-debug", gpu="cpu", num_nodes=1, gpus_per_node=4, world_size=4,
        tokens_per_s_per_gpu=1.0, mfu=0.1, peak_memory_gib=1.0, step_time_s=1.0,
        plan_hash=name.encode().hex().ljust(64, "0"), planner_version="test", created_at=datetime.now(UTC),
        request={}, plan={"schema_version": "1.0"},
    ))
    return int(connection.execute(sa.text("SELECT id FROM plans WHERE name = :n"), {"n": name}).scalar_one())


def _store_oom_run_and_replan(engine: sa.Engine) -> None:
    """At revision 0002: a plan, one OOM run of it and one completed run, and a re-plan from the OOM run."""
    with engine.begin() as connection:
        plan_id = _store_plan(connection, "ran out of memory")
        for outcome in ("oom", "completed"):
            connection.execute(_RUNS_0002.insert().values(
                plan_id=plan_id, outcome=outcome, predicted_step_time_s=1.0,
                predicted_tokens_per_s_per_gpu=1.0, predicted_peak_memory_gib=1.0,
                oom_step=3 if outcome == "oom" else None,
                oom_message="CUDA out of memory" if outcome == "oom" else None,
                created_at=datetime.now(UTC), raw={},
            ))
        connection.execute(sa.text("UPDATE validation_runs SET measured_step_time_s = 1.0, "
                                   "measured_tokens_per_s_per_gpu = 1.0, step_time_error_pct = 0.0, "
                                   "tokens_per_s_error_pct = 0.0 WHERE outcome = 'completed'"))
        run_id = connection.execute(
            sa.text("SELECT id FROM validation_runs WHERE outcome = 'oom'")).scalar_one()
        replan_id = _store_plan(connection, "re-planned")
        connection.execute(sa.text(
            "UPDATE plans SET replanned_from_plan_id = :plan, replanned_from_run_id = :run WHERE id = :id"
        ), {"plan": plan_id, "run": run_id, "id": replan_id})


def _store_study(engine: sa.Engine, points: int, *, state: str | None = "succeeded") -> None:
    """A study with `points` points; `state` None: at revision 0004 (before studies were jobs)."""
    with engine.begin() as connection:
        values: dict[str, Any] = {
            "name": "what if", "model_name": "llama-debug", "token_budget": 10**9, "gpus": "cpu",
            "num_candidates": points, "num_fitting": points, "planner_version": "test",
            "created_at": datetime.now(UTC), "request": {}, "summary": {},
        }
        if state is None:
            connection.execute(_STUDIES.insert().values(**values))
        else:
            connection.execute(_STUDIES_0005.insert().values(
                **values, state=state, candidates_done=points if state == "succeeded" else 0, attempts=1))
        study_id = connection.execute(sa.text("SELECT max(id) FROM studies")).scalar_one()
        for position in range(points):
            connection.execute(sa.text(
                "INSERT INTO study_points (study_id, position, point) VALUES (:s, :p, '{}')"
            ), {"s": study_id, "p": position})


def _count(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(sql)).scalar_one())


@pytest.fixture
def engine(fresh_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[sa.Engine]:
    monkeypatch.delenv(data_loss.FORCE_ENV, raising=False)
    engine = create_db_engine(fresh_url)
    yield engine
    engine.dispose()


def test_a_downgrade_that_would_delete_oom_runs_is_refused_and_changes_nothing(engine: sa.Engine) -> None:
    migrate.upgrade(engine, "0002")
    _store_oom_run_and_replan(engine)
    migrate.upgrade(engine)
    tables = set(inspect(engine).get_table_names())

    # Two steps down: 0004 (empty studies, no loss) and 0003 would run before 0002 refuses.
    with pytest.raises(data_loss.DataLossRefusedError) as refused:
        migrate.downgrade(engine, "0001")
    message = str(refused.value)
    assert "refusing to downgrade to 0001" in message
    assert "1 row of OOM validation runs (with their OOM details) (downgrade of 0002)" in message
    assert "1 row of re-plan links" in message
    assert "Nothing was changed" in message
    assert f"{data_loss.FORCE_ENV}=1" in message and "-x force_data_loss=true" in message
    # Every step rolled back, SQLite's dropped tables and columns included.
    assert migrate.current_revision(engine) == HEAD
    assert set(inspect(engine).get_table_names()) == tables
    assert {"sharding", "mesh"} <= {c["name"] for c in inspect(engine).get_columns("plans")}
    assert _count(engine, "SELECT count(*) FROM validation_runs") == 2
    assert _count(engine, "SELECT count(*) FROM plans WHERE replanned_from_run_id IS NOT NULL") == 1


def test_a_forced_downgrade_deletes_what_it_said(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.upgrade(engine, "0002")
    _store_oom_run_and_replan(engine)
    migrate.upgrade(engine)
    monkeypatch.setenv(data_loss.FORCE_ENV, "1")
    migrate.downgrade(engine, "0001")
    assert migrate.current_revision(engine) == "0001"
    assert _count(engine, "SELECT count(*) FROM validation_runs") == 1  # the completed run stays
    assert _count(engine, "SELECT count(*) FROM plans") == 2  # the re-plan stays, without its link


def test_dropping_studies_is_refused_with_their_count(engine: sa.Engine) -> None:
    migrate.upgrade(engine)
    _store_study(engine, points=3)
    with pytest.raises(data_loss.DataLossRefusedError, match=STUDY_LOSS.format(points=3)):
        migrate.downgrade(engine, "0003")
    assert migrate.current_revision(engine) == HEAD
    assert _count(engine, "SELECT count(*) FROM study_points") == 3


def test_empty_tables_downgrade_without_force(engine: sa.Engine) -> None:
    migrate.upgrade(engine, "0002")
    _store_oom_run_and_replan(engine)
    migrate.upgrade(engine)
    with engine.begin() as connection:  # no OOM run, no re-plan link, no study: nothing to lose
        connection.execute(sa.text("DELETE FROM plans WHERE replanned_from_run_id IS NOT NULL"))
        connection.execute(sa.text("DELETE FROM validation_runs WHERE outcome = 'oom'"))
    migrate.downgrade(engine, "0001")
    assert migrate.current_revision(engine) == "0001"
    everything = r"1 row of plans \(downgrade of 0001\); 1 row of validation runs"
    with pytest.raises(data_loss.DataLossRefusedError, match=everything):
        migrate.downgrade(engine, "base")


def test_the_alembic_command_refuses_and_is_forced_with_x(engine: sa.Engine, fresh_url: str) -> None:
    migrate.upgrade(engine)
    _store_study(engine, points=2)
    env = {**os.environ, "DATABASE_URL": fresh_url}
    env.pop(data_loss.FORCE_ENV, None)
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO_ROOT / "alembic.ini")]

    refused = subprocess.run([*alembic, "downgrade", "0003"], env=env, capture_output=True, text=True,
                             check=False)
    assert refused.returncode != 0
    assert re.search(STUDY_LOSS.format(points=2), refused.stderr), refused.stderr
    assert "Traceback" not in refused.stderr
    assert migrate.current_revision(engine) == HEAD

    forced = subprocess.run([*alembic, "-x", "force_data_loss=true", "downgrade", "0003"], env=env,
                            capture_output=True, text=True, check=False)
    assert forced.returncode == 0, forced.stderr
    assert migrate.current_revision(engine) == "0003"
    assert "studies" not in inspect(engine).get_table_names()


def test_0005_makes_stored_studies_succeeded_jobs_and_reverts(engine: sa.Engine,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.upgrade(engine, "0004")
    _store_study(engine, points=3, state=None)
    migrate.upgrade(engine)
    with engine.connect() as connection:
        row = connection.execute(sa.text(
            "SELECT state, candidates_done, num_candidates, error, idempotency_key, attempts, heartbeat_at "
            "FROM studies")).one()
        columns = {c["name"]: c for c in inspect(connection).get_columns("studies")}
    assert tuple(row) == ("succeeded", 3, 3, None, None, 0, None)
    assert not columns["state"]["nullable"] and not columns["candidates_done"]["nullable"]

    # An unfinished study cannot be kept by the old schema: refused, then deleted when forced.
    _store_study(engine, points=2, state="queued")
    with pytest.raises(data_loss.DataLossRefusedError,
                       match=r"1 row of unfinished or failed studies \(downgrade of 0005\)"):
        migrate.downgrade(engine, "0004")
    assert migrate.current_revision(engine) == HEAD
    monkeypatch.setenv(data_loss.FORCE_ENV, "1")
    migrate.downgrade(engine, "0004")
    assert _count(engine, "SELECT count(*) FROM studies") == 1
    assert _count(engine, "SELECT count(*) FROM study_points") == 3
    assert "state" not in {c["name"] for c in inspect(engine).get_columns("studies")}
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == HEAD
