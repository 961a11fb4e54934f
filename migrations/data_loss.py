"""Downgrades never delete rows silently: a step that would counts them first, and unless the operator
forced it the whole downgrade is refused, saying how many rows of what would go.

A downgrade step calls `count_before_delete` before it deletes or drops anything; env.py calls `begin`
before the steps and `refuse_unless_forced` after them, inside the one transaction they all run in. So
a refused downgrade rolls back every step (nothing changes), and the message lists what every step of
the way down would have deleted, not only the first. Empty tables downgrade without being forced.

Forcing: the environment variable FSDP_PLANNER_FORCE_DATA_LOSS=1 (`fsdp-planner db downgrade`, code),
or `alembic -x force_data_loss=true downgrade ...`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from alembic import context, op
from alembic.util import CommandError

FORCE_ENV = "FSDP_PLANNER_FORCE_DATA_LOSS"
FORCE_X_ARGUMENT = "force_data_loss"
_TRUE = frozenset({"1", "true", "yes", "on"})
_ATTRIBUTE = "fsdp_planner_data_loss"  # where a run's counts are kept, in its Alembic config

log = logging.getLogger(__name__)


class DataLossRefusedError(CommandError):
    """A downgrade would have deleted rows and was not forced; it changed nothing.

    A CommandError, so the `alembic` command line prints the message alone.
    """


@dataclass(frozen=True)
class Loss:
    """`rows` rows of `what`, deleted by the downgrade of `revision`."""

    revision: str
    what: str
    rows: int


def begin() -> None:
    """Start counting for one migration run (env.py, before the steps)."""
    context.config.attributes[_ATTRIBUTE] = []


def count_before_delete(revision: str, losses: Sequence[tuple[str, str]]) -> None:
    """In the downgrade of `revision`, before it changes anything: count what it would delete.

    `losses` are (what, SQL returning a count) pairs. Counts of zero are not losses.
    """
    connection = op.get_bind()
    found = context.config.attributes.setdefault(_ATTRIBUTE, [])
    for what, count_sql in losses:
        rows = int(connection.execute(sa.text(count_sql)).scalar_one())
        if rows:
            found.append(Loss(revision=revision, what=what, rows=rows))


def refuse_unless_forced() -> None:
    """After the steps, still inside their transaction: raise if they deleted rows and were not forced
    (the transaction then rolls back); when forced, log what went."""
    losses: list[Loss] = context.config.attributes.get(_ATTRIBUTE) or []
    if not losses:
        return
    listed = "; ".join(
        f"{loss.rows} {'row' if loss.rows == 1 else 'rows'} of {loss.what} (downgrade of {loss.revision})"
        for loss in losses
    )
    if forced():
        log.warning("forced downgrade deleted %s", listed)
        return
    raise DataLossRefusedError(
        f"refusing to downgrade to {context.get_revision_argument()}: it would delete {listed}. "
        f"Nothing was changed. To delete them anyway, set {FORCE_ENV}=1 "
        f"(with the alembic command: alembic -x {FORCE_X_ARGUMENT}=true downgrade ...)."
    )


def forced() -> bool:
    """Whether the operator accepted losing data: the environment variable or the `-x` argument."""
    x_arguments = context.get_x_argument(as_dictionary=True)
    values = (os.environ.get(FORCE_ENV, ""), x_arguments.get(FORCE_X_ARGUMENT, ""))
    return any(value.strip().lower() in _TRUE for value in values)
