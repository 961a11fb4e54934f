"""Alembic, driven from code: the migration scripts ship inside the package (the `migrations` package)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, func, select

# Any constant works; it only has to be the same in every process that migrates this database.
_PG_MIGRATION_LOCK_ID = 0x6673_6470_706C  # "fsdppl"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config whose script location resolves inside the installed package."""
    config = Config()
    import migrations

    # __path__ rather than __file__/importlib.resources: it also works under editable installs.
    config.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database up to `revision`; concurrent callers on PostgreSQL take turns."""
    with engine.begin() as connection:
        _lock(connection)
        command.upgrade(alembic_config(connection), revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database down to `revision` (`base` drops every table)."""
    with engine.begin() as connection:
        _lock(connection)
        command.downgrade(alembic_config(connection), revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


@cache
def head_revision() -> str | None:
    """The newest revision the code ships (read once per process)."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _lock(connection: Connection) -> None:
    # Several workers starting at once would otherwise race to create the same tables.
    if connection.dialect.name == "postgresql":
        connection.execute(select(func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK_ID)))
