"""Studies are jobs: their state, progress, failure reason and Idempotency-Key on the `studies` row.

studies: `state` (queued, running, succeeded, failed, cancelled), `candidates_done`, `best_so_far` (the
cheapest fitting point searched so far), `error`, `started_at`, `finished_at`, `attempts` and
`heartbeat_at` (a running study whose process went silent is queued again), and `idempotency_key`
(unique while set) with its body's `request_fingerprint`. Every study stored before was planned inside
its request, so existing rows are backfilled as succeeded with all their candidates done.

The key is unique through a unique index, not a constraint: SQLite adds an index without rebuilding the
table, and rebuilding `studies` would delete every point of every study (their foreign key cascades).
Downgrading deletes the studies that have not succeeded (they have no points, and the old schema
cannot say they are unfinished): refused while any exist, unless forced (migrations/data_loss.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations import data_loss

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)

_studies = sa.table("studies", sa.column("num_candidates", sa.Integer()), sa.column("candidates_done", sa.Integer()))


def upgrade() -> None:
    # SQLite adds a NOT NULL column only with a default (existing rows take it); PostgreSQL drops the
    # defaults again below (the service always writes the columns), SQLite keeps them (see 0003).
    op.add_column("studies", sa.Column("state", sa.String(16), nullable=False, server_default="succeeded"))
    op.add_column("studies", sa.Column("candidates_done", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("studies", sa.Column("best_so_far", JSON_DOC, nullable=True))
    op.add_column("studies", sa.Column("error", sa.Text(), nullable=True))
    op.add_column("studies", sa.Column("started_at", TIMESTAMP, nullable=True))
    op.add_column("studies", sa.Column("finished_at", TIMESTAMP, nullable=True))
    op.add_column("studies", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("studies", sa.Column("heartbeat_at", TIMESTAMP, nullable=True))
    op.add_column("studies", sa.Column("idempotency_key", sa.String(255), nullable=True))
    op.add_column("studies", sa.Column("request_fingerprint", sa.String(64), nullable=True))
    op.execute(_studies.update().values(candidates_done=_studies.c.num_candidates))
    op.create_index(op.f("ix_studies_state"), "studies", ["state"])
    op.create_index(op.f("ix_studies_idempotency_key"), "studies", ["idempotency_key"], unique=True)
    if op.get_context().dialect.name == "postgresql":
        op.alter_column("studies", "state", server_default=None)
        op.alter_column("studies", "candidates_done", server_default=None)
        op.alter_column("studies", "attempts", server_default=None)


def downgrade() -> None:
    data_loss.count_before_delete("0005", [
        ("unfinished or failed studies", "SELECT count(*) FROM studies WHERE state <> 'succeeded'"),
    ])
    op.execute("DELETE FROM studies WHERE state <> 'succeeded'")
    op.drop_index(op.f("ix_studies_idempotency_key"), table_name="studies")
    op.drop_index(op.f("ix_studies_state"), table_name="studies")
    for name in ("request_fingerprint", "idempotency_key", "heartbeat_at", "attempts", "finished_at",
                 "started_at", "error", "best_so_far", "candidates_done", "state"):
        op.drop_column("studies", name)
