"""A real (small-budget) calibration run on 2 CPU ranks: its output is a valid profile that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.parameters import default_parameters
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, TrainingSpec


@pytest.mark.distributed
def test_calibrate_on_cpu_writes_a_profile_the_planner_uses(tmp_path: Path) -> None:
    output = tmp_path / "cpu.json"
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--nproc",
            "2",
            "--model",
            "llama-debug",
            "--seq-len",
            "128",
            "--micro-batches",
            "1",
            "--budget-s",
            "12",
            "--name",
            "ci-cpu",
            "-o",
            str(output),
        ],
    )
    assert result.exit_code == 0, result.output
    profile = CalibrationProfile.model_validate(json.loads(output.read_text()))
    assert profile.fingerprint.backend == "gloo" and profile.fingerprint.device_count == 2
    assert profile.gpu == "cpu" and profile.model is not None and profile.model.name == "llama-debug"
    assert profile.matmul and profile.memory_bandwidth
    ops = {c.op for c in profile.collectives}
    assert ops == {"all_gather", "reduce_scatter", "all_reduce"}
    assert all(c.group_size == 2 and c.link == "intra" for c in profile.collectives)
    assert profile.blocks and {b.checkpointing for b in profile.blocks} <= {"none", "op_selective", "full"}

    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    fitted = fit_parameters(profile, base=base, precision="fp32")
    assert fitted.links["intra"] != base.links["intra"]  # measured, not the catalog guess
    assert fitted.memory_bandwidth != base.memory_bandwidth

    request = PlanRequest(
        model=resolve_model("llama-debug"),
        cluster=ClusterSpec.parse("1x2xcpu"),
        training=TrainingSpec(seq_len=128, global_batch_tokens=128 * 8, precision="fp32"),
    )
    plan = make_plan(request, calibration=profile, calibration_id="ci-cpu")
    assert plan.calibration_id == "ci-cpu"
    assert plan.prediction.step_time_s != make_plan(request).prediction.step_time_s
