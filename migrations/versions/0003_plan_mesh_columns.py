"""The device mesh of every plan as columns: sharding, tensor-parallel degree, data-parallel shard degree.

plans: `sharding` (the chosen strategy), `tensor_parallel_degree` (the mesh's tp) and
`data_parallel_shard_degree` (its dp_shard), so that lists filter on them and show the mesh
(dp_replicate = world_size / (dp_shard x tp)) without loading the Plan documents.

Existing rows are backfilled from their stored documents: `config.sharding`; `config.mesh.tp`
and `config.mesh.dp_shard` for schema 2.x plans, and tp 1 with dp_shard = `config.shard_group_size`
for schema 1.x plans (which had no tensor parallelism and no `mesh`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UNKNOWN_SHARDING = "unknown"
"""What a row whose document names no sharding (it could not be read as a plan) is backfilled with."""
# SQLite adds a NOT NULL column only with a default (existing rows take it); the backfill below
# overwrites every row, and PostgreSQL drops the defaults again (the service always writes the
# columns). SQLite keeps them: removing a default there rebuilds the table, and rebuilding `plans`
# with foreign keys on deletes every run and idempotency key that references it (see 0002).
COLUMNS = (
    ("sharding", sa.String(32), UNKNOWN_SHARDING),
    ("tensor_parallel_degree", sa.Integer(), "1"),
    ("data_parallel_shard_degree", sa.Integer(), "1"),
)

_plans = sa.table(
    "plans",
    sa.column("plan", JSON_DOC),
    *(sa.column(name, type_) for name, type_, _ in COLUMNS),
)


def upgrade() -> None:
    for name, type_, default in COLUMNS:
        op.add_column("plans", sa.Column(name, type_, nullable=False, server_default=default))
    # One UPDATE in SQL (json_extract on SQLite, #>> on PostgreSQL): the documents never travel to
    # Python, however many plans are stored. No index: lists filter on these columns beside others,
    # and each has a handful of values (an index on so few distinct values would rarely be used).
    document = _plans.c.plan
    op.execute(
        _plans.update().values(
            sharding=sa.func.coalesce(
                document[("config", "sharding")].as_string(), sa.literal(UNKNOWN_SHARDING)
            ),
            tensor_parallel_degree=sa.func.coalesce(
                document[("config", "mesh", "tp")].as_integer(), sa.literal(1)
            ),
            data_parallel_shard_degree=sa.func.coalesce(
                document[("config", "mesh", "dp_shard")].as_integer(),
                document[("config", "shard_group_size")].as_integer(),  # schema 1.x
                sa.literal(1),
            ),
        )
    )
    if op.get_context().dialect.name == "postgresql":
        for name, _, _ in COLUMNS:
            op.alter_column("plans", name, server_default=None)


def downgrade() -> None:
    # Nothing is lost: the documents still hold every value.
    for name, _, _ in reversed(COLUMNS):
        op.drop_column("plans", name)
