"""Writing under constraints on SQLite and PostgreSQL alike: `INSERT ... ON CONFLICT DO NOTHING
RETURNING id`, and telling a foreign-key violation from other integrity errors.

A plain INSERT that hits a unique constraint raises, and on PostgreSQL that aborts the whole
transaction, so a caller could not go on to read the row that won. With ON CONFLICT DO NOTHING the
statement inserts nothing instead (PostgreSQL first waits for a concurrent uncommitted insert of the
same value to commit or roll back), and the transaction stays usable.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def insert_unless_taken(session: Session, model: Any, values: dict[str, Any], *, unique: str) -> int | None:
    """Insert one `model` row; its id, or None when a row with the same `unique` column value exists."""
    dialect = session.get_bind().dialect.name
    try:
        insert = _INSERTS[dialect]
    except KeyError:
        raise NotImplementedError(f"only SQLite and PostgreSQL are supported, not {dialect}") from None
    statement = insert(model).values(**values).on_conflict_do_nothing(index_elements=[unique])
    return session.scalar(statement.returning(model.id))


def is_foreign_key_violation(error: IntegrityError) -> bool:
    """A row referred to by the statement does not exist (deleted meanwhile), as opposed to a bug."""
    driver_error = error.orig
    return (
        getattr(driver_error, "sqlstate", None) == "23503"  # PostgreSQL's foreign_key_violation
        or getattr(driver_error, "sqlite_errorname", None) == "SQLITE_CONSTRAINT_FOREIGNKEY"
    )
