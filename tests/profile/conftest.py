"""A live `fsdp-planner serve` on its own SQLite file, for the closed-loop tests (calibrate, plan,
validate, upload)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_server import running_server
from tests.migrated_database import migrate_empty_sqlite


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite file at the schema's head, migrated once per session; each server's database starts
    as a copy of it (its start-up still runs the migrations, at head)."""
    return migrate_empty_sqlite(tmp_path_factory.mktemp("migrated") / "loop.sqlite3")


@pytest.fixture
def server(tmp_path: Path, migrated_database: Path) -> Iterator[str]:
    database = tmp_path / "loop.sqlite3"
    shutil.copyfile(migrated_database, database)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}"}
    with running_server(env=env, log=tmp_path / "serve.log") as url:
        yield url
