"""docker-compose.yml and the Dockerfile: `docker compose config` accepts them; the wiring is right."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _check_wiring(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) == {"api", "postgres", "worker"}
    api, postgres, worker = services["api"], services["postgres"], services["worker"]
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["environment"]["DATABASE_URL"].startswith("postgresql+psycopg://fsdp:")
    assert "@postgres:5432/fsdp_planner" in api["environment"]["DATABASE_URL"]
    # Studies are jobs for the worker service (`--scale worker=N`): same image, same database.
    assert api["environment"]["FSDP_PLANNER_JOB_ENGINE"] == "procrastinate"
    assert worker["image"] == api["image"] and "ports" not in worker
    command = worker["command"] if isinstance(worker["command"], list) else worker["command"].split()
    assert command == ["fsdp-planner", "worker"]
    assert worker["environment"]["DATABASE_URL"] == api["environment"]["DATABASE_URL"]
    assert worker["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert worker["healthcheck"]["disable"] is True  # the image's check asks /readyz, which it lacks
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert "pgdata" in config["volumes"]
    volume = postgres["volumes"][0]
    target = volume["target"] if isinstance(volume, dict) else volume.split(":", 1)[1]
    assert target == "/var/lib/postgresql/data"


def test_compose_file_wiring() -> None:
    _check_wiring(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def test_docker_compose_config_accepts_it() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("the docker CLI is not installed")
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    result = subprocess.run(
        [docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    assert result.returncode == 0, result.stderr
    _check_wiring(json.loads(result.stdout))


def test_dockerfile_serves_without_torch() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install ." in dockerfile and "[executor" not in dockerfile  # no torch in the web image
    assert 'CMD ["fsdp-planner", "serve", "--host", "0.0.0.0"' in dockerfile
    assert "HEALTHCHECK" in dockerfile and "USER planner" in dockerfile
    for package in ("contract", "planner", "executor", "api", "migrations"):
        assert f"COPY {package} ./{package}" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "data"} <= set(ignored)
