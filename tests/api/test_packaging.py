"""The package builds the way scripts/serve.sh installs it: no setuptools deprecation warnings, and
every file the service reads at run time (templates, static assets, migrations) inside the wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_builds_without_warnings_and_carries_the_service_files(tmp_path: Path) -> None:
    # Built from a copy: pip builds in the source tree and would leave build/ and *.egg-info behind.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "data", "test-artifacts", "*.egg-info", "__pycache__", ".*_cache",
        ".hypothesis",
    ))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(tmp_path),
         str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # What serve.sh used to print three times per start: setuptools' deprecation banners.
    for marker in ("Deprecat", "BuildBackendWarning", "SetuptoolsWarning"):
        assert marker not in output, output
    (wheel,) = tmp_path.glob("fsdp_planner-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"api/docs.py", "api/dashboard/static/dashboard.css", "api/dashboard/templates/compare.html",
            "migrations/env.py", "migrations/script.py.mako",
            "migrations/procrastinate/schema-3.10.0.sql", "executor/launch/templates/launch.sh.j2"} <= names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text and "Requires-Dist: swagger-ui-bundle-v2" in text
