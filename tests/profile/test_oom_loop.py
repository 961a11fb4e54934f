"""The OOM loop on CPU against a real server: a plan's launcher runs out of memory (a real allocation
failure in backward on rank 1), `validate --upload` stores it as an OOM run and exits 5, the dashboard
shows it, and `replan` returns a stored plan below the failed configuration's predicted peak."""

from __future__ import annotations

import os

import httpx
import pytest
from typer.testing import CliRunner

from api.cli.common import EXIT_OOM
from api.cli.main import app
from tests.executor.conftest import REPO

pytestmark = pytest.mark.distributed


def test_oom_validate_upload_and_replan(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": "llama-debug", "cluster": "1x2xcpu", "search": {"compile": [False]},
            "training": {"seq_len": 64, "global_batch_tokens": 512, "precision": "fp32"}}
    plan = httpx.post(f"{server}/api/v1/plans", json=body, timeout=60).json()
    # The launcher's ranks import the failing factory from this repository.
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("OOM_RANK", "1")
    monkeypatch.setenv("OOM_STEP", "2")
    runner = CliRunner()
    validated = runner.invoke(app, [
        "validate", "--plan-id", str(plan["id"]), "--server", server, "--steps", "4", "--warmup", "1",
        "--upload", "--model-factory", "tests.executor.workers.oom_model:build",
    ])
    assert validated.exit_code == EXIT_OOM, validated.output
    output = " ".join(validated.output.split())
    assert "OUT OF MEMORY at step 2 (backward) on rank 1: tried to allocate 262144.00 GiB" in output
    assert f"predicted peak {plan['peak_memory_gib']:.2f} GiB per GPU" in output
    assert f"fsdp-planner replan {plan['id']}" in output

    (run,) = httpx.get(f"{server}/api/v1/plans/{plan['id']}/runs").json()["items"]
    assert run["outcome"] == "oom" and run["oom"]["step"] == 2 and run["oom"]["phase"] == "backward"
    assert run["oom"]["requested_bytes"] == 2**48 and run["step_time_error_pct"] is None
    page = httpx.get(f"{server}/plans/{plan['id']}").text
    assert f'id="run-{run["id"]}"' in page and "OOM at step 2, backward" in page

    replanned = runner.invoke(app, ["replan", str(plan["id"]), "--server", server])
    assert replanned.exit_code == 0, replanned.output
    assert f"as run {run['id']} of plan {plan['id']} did" in " ".join(replanned.output.split())
    new = httpx.get(f"{server}/api/v1/plans", params={"limit": 1}).json()["items"][0]
    assert new["id"] != plan["id"] and new["peak_memory_gib"] < plan["peak_memory_gib"]
    assert f"stored as plan {new['id']}" in replanned.output
