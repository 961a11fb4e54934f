"""The pipeline-parallel degree of every plan as a column.

plans: `pipeline_parallel_degree` (the mesh's pp), so that lists show and filter a plan's whole mesh
without loading its document: dp_replicate = world_size / (pp x dp_shard x cp x tp). Existing rows are
backfilled from their stored documents (`config.mesh.pp`), and plans stored before pipeline
parallelism have pp 1.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
COLUMN = "pipeline_parallel_degree"

_plans = sa.table("plans", sa.column("plan", JSON_DOC), sa.column(COLUMN, sa.Integer()))


def upgrade() -> None:
    # SQLite adds a NOT NULL column only with a default (see 0003: it stays there; PostgreSQL drops it).
    op.add_column("plans", sa.Column(COLUMN, sa.Integer(), nullable=False, server_default="1"))
    # One UPDATE in SQL: the documents never travel to Python, however many plans are stored.
    op.execute(
        _plans.update().values(
            {COLUMN: sa.func.coalesce(_plans.c.plan[("config", "mesh", "pp")].as_integer(), sa.literal(1))}
        )
    )
    if op.get_context().dialect.name == "postgresql":
        op.alter_column("plans", COLUMN, server_default=None)


def downgrade() -> None:
    # Nothing is lost: the documents still hold the degree.
    op.drop_column("plans", COLUMN)
