"""The expression index of the expert-parallel axis, `ix_plans_mesh_ep` (issue 40).

The mesh is one JSON document since 0010, so a new axis needs no column: plans stored before it lack
`ep`, which reads 1 (`Mesh.from_document`). Only its list filter's index is new, made on the very
expression the model's `mesh_degree("ep")` writes (an index serves only a query with the same one).
Downgrading drops the index and nothing else: the documents keep their `ep`, which an older planner
reads at 1 and refuses above it, naming the axis.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model's column type and expression: a migration must not change when they do.
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
AXIS = "ep"
INDEX = f"ix_plans_mesh_{AXIS}"

_plans = sa.table("plans", sa.column("mesh", JSON_DOC))


def _degree(axis: str) -> sa.ColumnElement[int]:
    """The model's `mesh_degree(axis)` as of this revision (0010's `_degree`)."""
    key = sa.bindparam(None, axis, type_=sa.JSON.JSONIndexType, literal_execute=True)
    return sa.func.coalesce(_plans.c.mesh[key].as_integer().self_group(), sa.literal(1, literal_execute=True))


def upgrade() -> None:
    op.create_index(INDEX, "plans", [_degree(AXIS)])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="plans")
