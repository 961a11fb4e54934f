"""Alembic environment: migrates the connection the service hands over, or DATABASE_URL from the CLI.

Every run is one transaction (on SQLite too), and a downgrade that would delete rows is refused unless
forced (migrations/data_loss.py).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from api.db import models  # noqa: F401  (registers the tables on Base.metadata)
from api.db.base import Base
from migrations import data_loss

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "sqlite" and not connection.connection.driver_connection.in_transaction:
            # Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE, so a DROP or ALTER
            # before the first one would commit by itself: open it now, and a failed run changes nothing.
            connection.exec_driver_sql("BEGIN")
        data_loss.begin()
        context.run_migrations()
        data_loss.refuse_unless_forced()  # raising rolls every step back


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    # Invoked as `alembic -c alembic.ini ...`: use the service's own settings.
    from api.db.session import create_db_engine
    from api.settings import Settings

    engine = create_db_engine(Settings().resolved_database_url)
    try:
        with engine.begin() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `fsdp-planner db upgrade`")
run_online()
