"""Initial schema: plans, calibration profiles, validation runs, API keys, idempotency keys.

Downgrading (to base) drops every table: refused while they hold rows, unless forced
(migrations/data_loss.py).

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations import data_loss

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
ACTIVE = sa.text("revoked_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("hashed_key", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("revoked_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("hashed_key", name=op.f("uq_api_keys_hashed_key")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_api_keys_prefix"), "api_keys", ["prefix"])
    op.create_index(
        "uq_api_keys_name_active", "api_keys", ["name"], unique=True,
        sqlite_where=ACTIVE, postgresql_where=ACTIVE,
    )

    op.create_table(
        "calibration_profiles",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("fingerprint", JSON_DOC, nullable=False),
        sa.Column("profile", JSON_DOC, nullable=False),
        sa.Column("fitted_parameters", JSON_DOC, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration_profiles")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_calibration_profiles_created_at"), "calibration_profiles", ["created_at"])

    op.create_table(
        "plans",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("gpu", sa.String(64), nullable=False),
        sa.Column("num_nodes", sa.Integer(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("tokens_per_s_per_gpu", sa.Float(), nullable=False),
        sa.Column("mfu", sa.Float(), nullable=False),
        sa.Column("peak_memory_gib", sa.Float(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("plan_hash", sa.String(64), nullable=False),
        sa.Column("planner_version", sa.String(32), nullable=False),
        sa.Column("calibration_id", BIG_ID, nullable=True),
        sa.Column("request", JSON_DOC, nullable=False),
        sa.Column("plan", JSON_DOC, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["calibration_id"], ["calibration_profiles.id"],
            name=op.f("fk_plans_calibration_id_calibration_profiles"), ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plans")),
        sa.UniqueConstraint("plan_hash", name=op.f("uq_plans_plan_hash")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_plans_calibration_id"), "plans", ["calibration_id"])
    for column in (
        "created_at", "tokens_per_s_per_gpu", "mfu", "peak_memory_gib", "world_size", "model_name", "gpu",
        "num_nodes",
    ):
        op.create_index(f"ix_plans_{column}_id", "plans", [column, "id"])

    op.create_table(
        "idempotency_keys",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_fingerprint", sa.String(64), nullable=False),
        sa.Column("plan_id", BIG_ID, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_idempotency_keys_plan_id_plans"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_keys")),
        sa.UniqueConstraint("key", name=op.f("uq_idempotency_keys_key")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_idempotency_keys_created_at"), "idempotency_keys", ["created_at"])
    op.create_index(op.f("ix_idempotency_keys_plan_id"), "idempotency_keys", ["plan_id"])

    op.create_table(
        "validation_runs",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("plan_id", BIG_ID, nullable=False),
        sa.Column("measured_step_time_s", sa.Float(), nullable=False),
        sa.Column("measured_tokens_per_s_per_gpu", sa.Float(), nullable=False),
        sa.Column("measured_peak_memory_gib", sa.Float(), nullable=True),
        sa.Column("predicted_step_time_s", sa.Float(), nullable=False),
        sa.Column("predicted_tokens_per_s_per_gpu", sa.Float(), nullable=False),
        sa.Column("predicted_peak_memory_gib", sa.Float(), nullable=False),
        sa.Column("step_time_error_pct", sa.Float(), nullable=False),
        sa.Column("tokens_per_s_error_pct", sa.Float(), nullable=False),
        sa.Column("peak_memory_error_pct", sa.Float(), nullable=True),
        sa.Column("raw", JSON_DOC, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_validation_runs_plan_id_plans"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validation_runs")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_validation_runs_plan_id"), "validation_runs", ["plan_id"])


def downgrade() -> None:
    data_loss.count_before_delete("0001", [
        (what, f"SELECT count(*) FROM {table}") for table, what in (
            ("plans", "plans"), ("calibration_profiles", "calibration profiles"),
            ("validation_runs", "validation runs"), ("api_keys", "API keys"),
            ("idempotency_keys", "idempotency keys"),
        )
    ])
    # Dependents first: their foreign keys point at plans and calibration_profiles.
    op.drop_table("validation_runs")
    op.drop_table("idempotency_keys")
    op.drop_table("plans")
    op.drop_table("calibration_profiles")
    op.drop_table("api_keys")
