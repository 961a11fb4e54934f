"""The documentation site, built once per session in strict mode (what CI builds), for the tests of its
pages and of the service that serves it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def build_site(*, config: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site_dir`: any warning (a broken link or anchor, a page
    left out of the nav) fails it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's notice about its successor
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site_dir)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = build_site(config=REPO / "mkdocs.yml", site_dir=site)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr
    return site
