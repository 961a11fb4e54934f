"""Large plan searches and re-plans are jobs: the `plan_jobs` table.

A re-plan (POST /plans/{id}/replan), and a POST /plans whose layer graph is beyond
`FSDP_PLANNER_JOB_THRESHOLD_UNITS`, is stored as a `plan_jobs` row in state `queued` and answered with 202;
the same job engines as studies run it (the in-process engine claims the row, procrastinate workers take
its job from the `plans` queue), and on success the row names the ordinary plan it stored. The job
columns are those of `studies` (state, attempts, heartbeat, error, Idempotency-Key with its fingerprint).

Downgrading drops the table: refused while it holds jobs not finished (they would never run), unless
forced (migrations/data_loss.py). Finished jobs are records only (their plans stay).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations import data_loss

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "plan_jobs",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.Column("body", JSON_DOC, nullable=False),
        sa.Column("source_plan_id", BIG_ID, nullable=True),
        sa.Column("plan_id", BIG_ID, nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("problem", JSON_DOC, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("request_fingerprint", sa.String(64), nullable=True),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_plan_jobs_plan_id_plans"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plan_jobs")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_plan_jobs_created_at"), "plan_jobs", ["created_at"])
    op.create_index(op.f("ix_plan_jobs_state"), "plan_jobs", ["state"])
    op.create_index(op.f("ix_plan_jobs_source_plan_id"), "plan_jobs", ["source_plan_id"])
    op.create_index(op.f("ix_plan_jobs_plan_id"), "plan_jobs", ["plan_id"])
    op.create_index("ix_plan_jobs_idempotency_key", "plan_jobs", ["idempotency_key"], unique=True)


def downgrade() -> None:
    data_loss.count_before_delete("0007", [
        ("queued or running plan jobs", "SELECT count(*) FROM plan_jobs WHERE state IN ('queued', 'running')"),
    ])
    if op.get_context().dialect.name == "postgresql":
        # Their task-engine jobs would run a job that no longer exists.
        op.execute("DELETE FROM procrastinate.procrastinate_jobs WHERE queue_name = 'plans' "
                   "AND status IN ('todo', 'doing')")
    op.drop_table("plan_jobs")
