"""What-if studies: `studies` and their candidate clusters, `study_points`.

A point refers to the ordinary plan stored for its cluster; deleting that plan keeps the point (and its
numbers) with `plan_id` set to NULL, and deleting a study deletes its points but never its plans.
Downgrading drops both tables (the studies are lost; their plans stay): refused while they hold rows,
unless forced (migrations/data_loss.py).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations import data_loss

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("token_budget", sa.BigInteger(), nullable=False),
        sa.Column("deadline_days", sa.Float(), nullable=True),
        sa.Column("gpus", sa.String(1000), nullable=False),
        sa.Column("num_candidates", sa.Integer(), nullable=False),
        sa.Column("num_fitting", sa.Integer(), nullable=False),
        sa.Column("planner_version", sa.String(32), nullable=False),
        sa.Column("request", JSON_DOC, nullable=False),
        sa.Column("summary", JSON_DOC, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_studies_created_at"), "studies", ["created_at"])

    op.create_table(
        "study_points",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("study_id", BIG_ID, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("plan_id", BIG_ID, nullable=True),
        sa.Column("point", JSON_DOC, nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name=op.f("fk_study_points_study_id_studies"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_study_points_plan_id_plans"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study_points")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_study_points_study_id"), "study_points", ["study_id"])
    op.create_index(op.f("ix_study_points_plan_id"), "study_points", ["plan_id"])


def downgrade() -> None:
    data_loss.count_before_delete("0004", [
        ("studies", "SELECT count(*) FROM studies"),
        ("study points", "SELECT count(*) FROM study_points"),
    ])
    op.drop_table("study_points")  # first: it refers to studies
    op.drop_table("studies")
