"""The service commands: `db upgrade`, `keys create|list|revoke`, and `serve` as a real uvicorn process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from api.cli.calibrate_cmd import show_fit
from api.cli.main import app
from planner.calibration import CalibrationProfile
from tests.api.conftest import cpu_profile
from tests.live_server import running_server

runner = CliRunner()


@pytest.fixture
def fresh_url(backend: str, database_factory: Callable[[str], str]) -> str:
    return database_factory(backend)


def test_db_upgrade_and_current(fresh_url: str) -> None:
    result = runner.invoke(app, ["db", "upgrade", "--database-url", fresh_url])
    assert result.exit_code == 0, result.output
    assert "at revision 0011" in result.output
    result = runner.invoke(app, ["db", "current", "--database-url", fresh_url])
    assert "current: 0011" in result.output and "head: 0011" in result.output
    assert runner.invoke(app, ["db", "downgrade", "base", "--database-url", fresh_url]).exit_code == 0
    assert "current: None" in runner.invoke(app, ["db", "current", "--database-url", fresh_url]).output


def test_keys_create_list_revoke(fresh_url: str) -> None:
    created = runner.invoke(app, ["keys", "create", "ci", "--database-url", fresh_url])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()
    assert key.startswith("fsdpk_") and "\n" not in key  # the key alone on stdout: KEY=$(...) works
    assert "not shown again" in created.stderr

    listed = runner.invoke(app, ["keys", "list", "--database-url", fresh_url])
    assert "ci" in listed.output and "active" in listed.output
    assert key not in listed.output and key.split("_")[1] in listed.output  # the prefix identifies it

    duplicate = runner.invoke(app, ["keys", "create", "ci", "--database-url", fresh_url])
    assert duplicate.exit_code == 1 and "active key named 'ci' exists" in duplicate.stderr

    revoked = runner.invoke(app, ["keys", "revoke", "ci", "--database-url", fresh_url])
    assert revoked.exit_code == 0 and "revoked key 1 (ci)" in revoked.output
    assert "writes are open again" in revoked.output
    again = runner.invoke(app, ["keys", "revoke", "1", "--database-url", fresh_url])
    assert again.exit_code == 1 and "already revoked" in again.stderr
    assert "revoked" in runner.invoke(app, ["keys", "list", "--database-url", fresh_url]).output
    # A superscript digit is a name, not an id (int('²') raised before).
    unicode_digit = runner.invoke(app, ["keys", "revoke", "²", "--database-url", fresh_url])
    assert unicode_digit.exit_code == 1 and "no key with id or active name '²'" in unicode_digit.stderr


@pytest.fixture
def server(fresh_url: str, tmp_path: Path) -> Iterator[str]:
    """`fsdp-planner serve` in a subprocess, as the README runs it; yields its base URL."""
    env = {**os.environ, "DATABASE_URL": fresh_url}
    with running_server(env=env, log=tmp_path / "serve.log", cwd=tmp_path) as url:
        yield url


def test_serve_migrates_and_answers(server: str, fresh_url: str) -> None:
    body = {
        "model": "gpt2",
        "cluster": "1x8xH100",
        "training": {"seq_len": 1024, "global_batch_tokens": 65536},
    }
    created = httpx.post(f"{server}/api/v1/plans", json=body, timeout=60)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"/api/v1/plans/{created.json()['id']}"  # a path, not Host
    listed = httpx.get(f"{server}/api/v1/plans", params={"model": "gpt2"}).json()
    assert [p["id"] for p in listed["items"]] == [created.json()["id"]]
    assert httpx.get(f"{server}/docs").status_code == 200
    assert httpx.get(f"{server}/openapi.json").json()["info"]["title"] == "fsdp-planner"

    # A key created by the CLI locks writes on the running server at once.
    key = runner.invoke(app, ["keys", "create", "ops", "--database-url", fresh_url]).stdout.strip()
    assert httpx.delete(server + created.headers["location"]).status_code == 401
    deleted = httpx.delete(server + created.headers["location"], headers={"Authorization": f"Bearer {key}"})
    assert deleted.status_code == 204


def test_calibrate_shows_the_fit_of_a_profile_that_names_only_its_device() -> None:
    # A profile without `gpu` is fitted from the catalog GPU its device reports itself as, as the
    # service stores it; an unknown device says what to set instead of failing.
    console = Console(record=True, width=200)
    show_fit(CalibrationProfile.model_validate(cpu_profile(gpu=None)), console)
    text = console.export_text()
    assert "matmul efficiency" in text and "intra-node latency per doubling" in text

    unknown = cpu_profile(gpu=None)
    unknown["fingerprint"] = {**unknown["fingerprint"], "device_name": "Mystery Accelerator 9000"}
    console = Console(record=True, width=200)
    show_fit(CalibrationProfile.model_validate(unknown), console)
    assert "set the profile's `gpu`" in console.export_text()


def _whatif_on(server: str, *options: str):  # type: ignore[no-untyped-def]
    """`fsdp-planner whatif` of gpt2 on 10B tokens at seq 1024, stored on `server`, with `options`."""
    result = runner.invoke(app, [
        "whatif", "--model", "gpt2", "--tokens", "10B", "--seq-len", "1024",
        "--global-batch-tokens", "262144", *options, "--server", server,
    ], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


def test_whatif_stores_the_study_on_a_server(server: str) -> None:
    result = _whatif_on(server, "--gpu", "H100=2.5", "--sizes", "8,16", "--name", "from the CLI")
    listed = httpx.get(f"{server}/api/v1/studies").json()["items"]
    assert [s["name"] for s in listed] == ["from the CLI"]
    assert f"Stored as study {listed[0]['id']}: {server}/studies/{listed[0]['id']}" in result.output
    assert "H100-SXM-80GB" in result.output and "cost" in result.output  # the stored study as a table


def test_whatif_states_the_network_of_a_study_on_a_server(server: str) -> None:
    result = _whatif_on(server, "--gpu", "H100", "--sizes", "16", "--network", "800G")
    [listed] = httpx.get(f"{server}/api/v1/studies").json()["items"]
    stored = httpx.get(f"{server}/api/v1/studies/{listed['id']}").json()
    assert stored["request"]["inter_node_bandwidth_gbps"] == 100.0
    plan = httpx.get(f"{server}/api/v1/plans/{stored['points'][0]['plan_id']}").json()["plan"]
    assert plan["cluster"]["inter_node_bandwidth_gbps"] == 100.0
    assert "network 800 Gb/s per GPU (100 GB/s)" in result.stdout  # the stored study's headline
