"""The device mesh of every plan as one JSON document, instead of one column per axis.

plans: `mesh` (what `Mesh.as_document()` writes: every axis's degree) replaces the columns that
0003, 0008 and 0009 added one axis at a time (`pipeline_parallel_degree`, `data_parallel_shard_degree`,
`context_parallel_degree`, `tensor_parallel_degree`); a new axis needs no column and no migration to
be stored. dp_replicate, which no column held, is written as the API showed it: what the world size
leaves, at least 1. One expression index per axis (`ix_plans_mesh_<axis>`) serves the list filters.

Each row's document is made from its own columns (not from its Plan document), so that it holds exactly
what the columns held, for plans of every schema version: 0003 read 1.x plans' meshes already.
Downgrading makes the columns again from the documents: nothing is lost (dp_replicate is derived again).
A degree the columns cannot hold (on an axis added after this revision, or a dp_replicate that the world
size does not give) is counted first, and the downgrade refused unless forced (migrations/data_loss.py).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations import data_loss

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types and of the axes: a migration must not change when they do.
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
COLUMNS = {
    "pp": "pipeline_parallel_degree",
    "dp_shard": "data_parallel_shard_degree",
    "cp": "context_parallel_degree",
    "tp": "tensor_parallel_degree",
}
"""Each stored axis -> the column that held it until now."""
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The mesh's axes at this revision (contract.mesh.MESH_AXES), in `Mesh.as_document()` order."""
# SQLite adds a NOT NULL column only with a default (see 0003: it stays there; PostgreSQL drops it).
# Every axis at 1, like `Mesh()`; the upgrade overwrites every row's.
ALL_ONES = "{" + ", ".join(f'"{axis}": 1' for axis in AXES) + "}"

_plans = sa.table(
    "plans",
    sa.column("world_size", sa.Integer()),
    sa.column("mesh", JSON_DOC),
    *(sa.column(column, sa.Integer()) for column in COLUMNS.values()),
)


def _degree(axis: str) -> sa.ColumnElement[int]:
    """The model's `mesh_degree(axis)` as of this revision: the expression each index is made on, the
    axis and the 1 written into the SQL (an index serves only a query with the very same expression)."""
    key = sa.bindparam(None, axis, type_=sa.JSON.JSONIndexType, literal_execute=True)
    return sa.func.coalesce(_plans.c.mesh[key].as_integer().self_group(), sa.literal(1, literal_execute=True))


def _replicas(degrees: dict[str, sa.ColumnElement[int]]) -> sa.ColumnElement[int]:
    """What the world size leaves of the other degrees, at least 1 (integer division on both databases),
    as the API showed dp_replicate (api/schemas/plans.py) while only the other axes had columns."""
    others = degrees["pp"] * degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    return sa.case((_plans.c.world_size > others, _plans.c.world_size // others), else_=1)


def _with_other_replicas() -> sa.Select[tuple[int]]:
    degrees = {axis: _degree(axis) for axis in COLUMNS}
    return sa.select(sa.func.count()).select_from(_plans).where(_degree("dp_replicate") != _replicas(degrees))


_KNOWN = ", ".join(f"'{axis}'" for axis in AXES)
_SPLIT_ON_OTHER_AXES = {
    "sqlite": "SELECT count(*) FROM plans WHERE EXISTS (SELECT 1 FROM json_each(plans.mesh) AS axis "
    f"WHERE axis.key NOT IN ({_KNOWN}) AND axis.value <> 1)",
    "postgresql": "SELECT count(*) FROM plans WHERE EXISTS (SELECT 1 FROM jsonb_each(plans.mesh) AS axis "
    f"WHERE axis.key NOT IN ({_KNOWN}) AND axis.value <> '1'::jsonb)",
}
"""Plans with a degree above 1 on an axis this revision does not know, per dialect (JSON keys are
enumerated differently)."""


def _index(axis: str) -> str:
    return f"ix_plans_mesh_{axis}"


def upgrade() -> None:
    op.add_column("plans", sa.Column("mesh", JSON_DOC, nullable=False, server_default=ALL_ONES))
    # One UPDATE in SQL: the rows never travel to Python, however many plans are stored.
    degrees = {axis: _plans.c[column] for axis, column in COLUMNS.items()}
    degrees["dp_replicate"] = _replicas(degrees)
    on_postgresql = op.get_context().dialect.name == "postgresql"
    build = sa.func.jsonb_build_object if on_postgresql else sa.func.json_object
    pairs = [part for axis in AXES for part in (sa.literal(axis), degrees[axis])]
    op.execute(_plans.update().values(mesh=build(*pairs)))
    if on_postgresql:
        op.alter_column("plans", "mesh", server_default=None)
    for axis in AXES:
        op.create_index(_index(axis), "plans", [_degree(axis)])
    # Plain DROP COLUMN (SQLite >= 3.35), never a batch rebuild: rebuilding `plans` on SQLite drops it,
    # and with foreign keys on that deletes every run and idempotency key that references it (see 0002).
    for column in reversed(COLUMNS.values()):
        op.drop_column("plans", column)


def downgrade() -> None:
    # The four columns hold every axis but dp_replicate, which the world size gives: nothing is lost,
    # unless a later planner stored an axis of its own, or a dp_replicate the world size does not give.
    data_loss.count_before_delete("0010", [
        (f"plans' degrees above 1 on axes other than {', '.join(AXES)} (their meshes lose them)",
         _SPLIT_ON_OTHER_AXES[op.get_context().dialect.name]),
        ("plans' dp_replicate degrees that their world size does not give (their meshes lose them)",
         str(_with_other_replicas().compile(dialect=op.get_bind().dialect,
                                            compile_kwargs={"literal_binds": True}))),
    ])
    for column in COLUMNS.values():
        op.add_column("plans", sa.Column(column, sa.Integer(), nullable=False, server_default="1"))
    op.execute(_plans.update().values({column: _degree(axis) for axis, column in COLUMNS.items()}))
    if op.get_context().dialect.name == "postgresql":
        for column in COLUMNS.values():
            op.alter_column("plans", column, server_default=None)
    for axis in reversed(AXES):
        op.drop_index(_index(axis), table_name="plans")
    op.drop_column("plans", "mesh")
