"""Out-of-memory validation runs and re-planned plans.

validation_runs: an `outcome` (`completed`, the default for every existing row, or `oom`), the OOM
details, and measurements / prediction errors made nullable (an OOM run has none).
plans: `replanned_from_plan_id` / `replanned_from_run_id`, the provenance of a re-plan.

Downgrading deletes OOM runs (the old schema cannot hold a run without measurements) and re-plan links:
refused while there are any, unless forced (migrations/data_loss.py).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations import data_loss

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NULLABLE_NOW = (
    "measured_step_time_s", "measured_tokens_per_s_per_gpu", "step_time_error_pct", "tokens_per_s_error_pct"
)
OOM_COLUMNS = (
    ("oom_step", sa.Integer()),
    ("oom_phase", sa.String(32)),
    ("oom_requested_bytes", sa.BigInteger()),
    ("oom_allocated_bytes", sa.BigInteger()),
    ("oom_reserved_bytes", sa.BigInteger()),
    ("oom_message", sa.String(2000)),
)


def upgrade() -> None:
    # Batch mode rebuilds the table on SQLite (which cannot ALTER a column's nullability). Safe here:
    # no other table references validation_runs, so dropping the old copy cascades nothing.
    with op.batch_alter_table("validation_runs") as batch:
        batch.add_column(
            sa.Column("outcome", sa.String(16), nullable=False, server_default="completed")
        )
        for name in NULLABLE_NOW:
            batch.alter_column(name, existing_type=sa.Float(), nullable=True)
        for name, type_ in OOM_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    # Plain ADD COLUMN (no table rebuild): rebuilding `plans` on SQLite would drop it, and with foreign
    # keys on, that deletes every run and idempotency key that references it.
    op.add_column("plans", sa.Column("replanned_from_plan_id", BIG_ID, nullable=True))
    op.add_column("plans", sa.Column("replanned_from_run_id", BIG_ID, nullable=True))
    op.create_index(op.f("ix_plans_replanned_from_plan_id"), "plans", ["replanned_from_plan_id"])


def downgrade() -> None:
    data_loss.count_before_delete("0002", [
        ("OOM validation runs (with their OOM details)",
         "SELECT count(*) FROM validation_runs WHERE outcome <> 'completed'"),
        ("re-plan links (plans.replanned_from_plan_id / replanned_from_run_id)",
         "SELECT count(*) FROM plans "
         "WHERE replanned_from_plan_id IS NOT NULL OR replanned_from_run_id IS NOT NULL"),
    ])
    op.drop_index(op.f("ix_plans_replanned_from_plan_id"), table_name="plans")
    op.drop_column("plans", "replanned_from_run_id")
    op.drop_column("plans", "replanned_from_plan_id")
    op.execute(sa.text("DELETE FROM validation_runs WHERE outcome <> 'completed'"))
    with op.batch_alter_table("validation_runs") as batch:
        for name, _ in reversed(OOM_COLUMNS):
            batch.drop_column(name)
        for name in NULLABLE_NOW:
            batch.alter_column(name, existing_type=sa.Float(), nullable=False)
        batch.drop_column("outcome")
