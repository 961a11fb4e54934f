"""A live `fsdp-planner serve` on its own SQLite file, for the closed-loop tests (calibrate, plan,
validate, upload)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_server import running_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'loop.sqlite3'}"}
    with running_server(env=env, log=tmp_path / "serve.log") as url:
        yield url
