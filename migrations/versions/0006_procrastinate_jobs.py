"""The task engine's tables: procrastinate's schema, in a PostgreSQL schema of its own (`procrastinate`).

With `FSDP_PLANNER_JOB_ENGINE=procrastinate` a study is a procrastinate job too (api/services/
task_engine.py): the web process defers it in the transaction that stores the study, `fsdp-planner
worker` processes (on any machine) run it. Procrastinate's objects live in the `procrastinate` schema, not
beside the service's tables: its connections name that schema first on their search path, and the
service's models (and `alembic check`) never see them.

The SQL is procrastinate 3.10.0's `schema.sql`, frozen beside this file (a migration must not change when
the library does; pyproject pins procrastinate to 3.10.x). Moving to a later procrastinate is a new
revision that applies the library's own migration files (`procrastinate/sql/migrations/*.sql`) between
the two versions, in the same schema.

SQLite has no procrastinate (the embedded default runs studies in the web process): this revision does
nothing there. Downgrading drops the schema: refused while it holds jobs not finished (queued studies
would lose their jobs) unless forced (migrations/data_loss.py).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

from migrations import data_loss

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "procrastinate"
SCHEMA_SQL = Path(__file__).resolve().parents[1] / "procrastinate" / "schema-3.10.0.sql"


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    bind = op.get_bind()
    bind.exec_driver_sql(f"CREATE SCHEMA {SCHEMA}")
    # Unqualified names in procrastinate's SQL land in (and resolve from) its schema; the migration's
    # transaction gets its search path back afterwards.
    previous = bind.exec_driver_sql("SELECT current_setting('search_path')").scalar_one()
    bind.exec_driver_sql(f"SET LOCAL search_path TO {SCHEMA}")
    # On the driver's own cursor: without parameters, psycopg reads no placeholders in the script
    # (its RAISE messages use `%`).
    with bind.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
        cursor.execute(SCHEMA_SQL.read_text())
    bind.exec_driver_sql("SELECT set_config('search_path', %(previous)s, true)", {"previous": previous})


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    data_loss.count_before_delete("0006", [
        ("queued or running task-engine jobs",
         f"SELECT count(*) FROM {SCHEMA}.procrastinate_jobs WHERE status IN ('todo', 'doing')"),
    ])
    op.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
