"""Engine and session factory: one engine per process, SQLite tuned for a concurrent web server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

# How long a SQLite writer waits for another writer's lock before giving up.
SQLITE_BUSY_TIMEOUT_S = 30


def create_db_engine(url: str, *, pool_size: int = 10, max_overflow: int = 30) -> Engine:
    """An engine for `url`; SQLite files get WAL, foreign keys and a busy timeout on every connection."""
    parsed = make_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        # Request threads share the pool, so a connection may move between threads.
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
        if parsed.database in (None, "", ":memory:"):
            # One shared connection, or every session would see its own empty database.
            kwargs["poolclass"] = StaticPool
        else:
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs.update(pool_size=pool_size, max_overflow=max_overflow)
    else:
        kwargs.update(pool_size=pool_size, max_overflow=max_overflow)
    engine = create_engine(parsed, **kwargs)
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _configure_sqlite_connection)
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers run while one writer commits; foreign keys are off by default in SQLite.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
    finally:
        cursor.close()


def create_session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows are returned to the client after commit; expiring them would cost a reload per response.
    return sessionmaker(engine, expire_on_commit=False)
