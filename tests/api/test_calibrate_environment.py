"""`fsdp-planner calibrate` profiles under the launch bundles' environment of this torch build's vendor:
a ROCm build reads `PYTORCH_HIP_ALLOC_CONF` (before the CUDA name), so a calibration there sets it, as
an AMD plan's bundle does; a CUDA build gets the NVIDIA table, without the HIP names."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from api.cli import calibrate_cmd
from api.cli.main import app
from executor.launch.bundle import bundle_files
from planner.cost.memory import PRICED_ALLOCATOR_CONFIG
from planner.search import make_plan
from tests.planner.conftest import make_request

ALLOCATOR = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def _calibration_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hip: str | None) -> dict[str, str]:
    """The environment `calibrate` starts the profiler with, on a torch build with this HIP version."""
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    for name in ALLOCATOR:
        monkeypatch.delenv(name, raising=False)
    started: list[dict[str, str]] = []

    def run(command: list[str], *, env: dict[str, str], **_: Any) -> subprocess.CompletedProcess[str]:
        started.append(env)
        return subprocess.CompletedProcess(command, 1)  # the profiler itself is not run here

    monkeypatch.setattr(calibrate_cmd.subprocess, "run", run)
    result = CliRunner().invoke(app, ["calibrate", "--nproc", "1", "-o", str(tmp_path / "p.json")])
    assert result.exit_code != 0 and "the profiler exited with status 1" in result.output, result.output
    (env,) = started
    return env


def _bundle_env(cluster: str) -> dict[str, str]:
    """What an Instinct or NVIDIA plan's Kubernetes TrainJob sets for its trainer."""
    plan = make_plan(make_request("llama3-8b", cluster, seq_len=4096, sequences=64))
    manifest = next(f.data.decode() for f in bundle_files(plan, target="k8s") if f.path == "k8s.yaml")
    job = next(d for d in yaml.safe_load_all(manifest) if d and d.get("kind") == "TrainJob")
    trainer = job["spec"]["trainer"]
    return {item["name"]: item["value"] for item in trainer["env"]}


def test_a_rocm_build_calibrates_under_the_hip_allocator_as_its_bundles_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = _calibration_env(monkeypatch, tmp_path, "7.2.41134-abc")
    assert env["PYTORCH_HIP_ALLOC_CONF"] == PRICED_ALLOCATOR_CONFIG
    bundle = _bundle_env("1x8xMI300X")
    # The calibration's ROCm settings are the AMD bundle's: allocator, scratch memory, hipBLASLt.
    for name in ("PYTORCH_HIP_ALLOC_CONF", "HSA_NO_SCRATCH_RECLAIM", "TORCH_BLAS_PREFER_HIPBLASLT"):
        assert env[name] == bundle[name], name


def test_a_cuda_build_calibrates_under_the_cuda_allocator_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = _calibration_env(monkeypatch, tmp_path, None)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == PRICED_ALLOCATOR_CONFIG == _bundle_env("1x8xH100")[ALLOCATOR[0]]
    assert "PYTORCH_HIP_ALLOC_CONF" not in env and "HSA_NO_SCRATCH_RECLAIM" not in env


def test_a_value_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTORCH_HIP_ALLOC_CONF", "garbage_collection_threshold:0.8")
    monkeypatch.setattr(torch.version, "hip", "7.2", raising=False)
    started: list[dict[str, str]] = []

    def run(command: list[str], *, env: dict[str, str], **_: Any) -> subprocess.CompletedProcess[str]:
        started.append(env)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(calibrate_cmd.subprocess, "run", run)
    CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "p.json")])
    assert started[0]["PYTORCH_HIP_ALLOC_CONF"] == "garbage_collection_threshold:0.8"
