"""A database of its own for one benchmark run (imported by the bench scripts that start a server).

SQLite: a new file in a temporary folder. PostgreSQL: a new database on the server that
`FSDP_PLANNER_BENCH_POSTGRES_URL` names (default the local trust-auth server's `postgres`), dropped
afterwards even with connections still open.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_ADMIN_URL = os.environ.get(
    "FSDP_PLANNER_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@contextmanager
def scratch_database(backend: Literal["sqlite", "postgresql"]) -> Iterator[str]:
    """The URL of an empty database on `backend`, gone when the block ends."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{Path(folder) / 'bench.sqlite3'}"
        return
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fsdp_planner_bench_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
