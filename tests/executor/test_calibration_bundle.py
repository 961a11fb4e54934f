"""Calibration bundles for multi-node clusters: rendered safely, and runnable (here on 2 CPU ranks)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from executor.launch.calibration import calibration_bundle_files, write_calibration_bundle
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.specs import ClusterSpec

HOSTILE = 'x"; touch "$HOME/pwned"; "'


def test_multi_node_bundle_scripts(tmp_path: Path) -> None:
    cluster = ClusterSpec.parse("2x8xH100")
    directory = write_calibration_bundle(cluster, tmp_path, model=resolve_model("llama3-8b"), seq_len=8192)
    names = {f.path for f in calibration_bundle_files(cluster)}
    assert {
        "calibrate.sh",
        "calibrate.sbatch",
        "README.md",
        "executor/profile/run.py",
        "executor/runtime/models/llama.py",
    } <= names
    for script in ("calibrate.sh", "calibrate.sbatch"):
        assert subprocess.run(["bash", "-n", str(directory / script)], check=False).returncode == 0
    sbatch = (directory / "calibrate.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --gpus-per-node=8" in sbatch
    assert '"$BUNDLE_DIR/calibrate.sh"' in sbatch
    launch = (directory / "calibrate.sh").read_text()
    assert "-m executor.profile.run" in launch and "--seq-len 8192" in launch
    assert "CHECKPOINT_DIR" not in launch  # a profile has nothing to resume


def test_hostile_name_is_data_not_code(tmp_path: Path) -> None:
    directory = write_calibration_bundle(ClusterSpec.parse("1x2xcpu"), tmp_path, name=HOSTILE, budget_s=5)
    home = tmp_path / "home"
    home.mkdir()
    fake = tmp_path / "fake-python"
    record = tmp_path / "argv.txt"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHON": str(fake)}
    result = subprocess.run(
        [str(directory / "calibrate.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    argv = record.read_text().splitlines()
    assert argv[argv.index("--name") + 1] == HOSTILE
    assert not (home / "pwned").exists()


@pytest.mark.parametrize("bad", [{"micro_batches": "1;rm"}, {"budget_s": -1.0}, {"seq_len": 0}])
def test_bad_options_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError):
        calibration_bundle_files(ClusterSpec.parse("1x2xcpu"), **bad)


@pytest.mark.distributed
def test_bundle_runs_on_two_cpu_ranks_and_writes_a_profile(tmp_path: Path) -> None:
    directory = write_calibration_bundle(
        ClusterSpec.parse("1x2xcpu"),
        tmp_path,
        model=resolve_model("llama-debug"),
        seq_len=128,
        micro_batches="1",
        budget_s=6,
        name="bundle-cpu",
    )
    # Scalar C++ kernels for the compiled steps: they compile faster on a 2-core machine (as job_env's in
    # tests/executor/conftest.py), and what is checked here is that the bundle runs and writes its profile.
    env = {**os.environ, "NPROC_PER_NODE": "2", "PYTHON": os.environ.get("PYTHON", "python"),
           "TORCHINDUCTOR_VEC_ISA_OK": "0"}
    result = subprocess.run(
        [str(directory / "calibrate.sh")], env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    profile = CalibrationProfile.model_validate_json((directory / "profile.json").read_text())
    assert profile.name == "bundle-cpu" and profile.fingerprint.device_count == 2
    assert profile.collectives and profile.blocks
