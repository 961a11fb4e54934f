"""The closed loop on CPU: calibrate -> upload -> plan with the profile -> validate -> stored run."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from api.cli.main import app
from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.cost.memory import PRICED_ALLOCATOR_CONFIG
from planner.cost.parameters import default_parameters
from planner.specs import ClusterSpec
from tests.output_checks import python_warnings

pytestmark = pytest.mark.distributed


def check_profile(profile: CalibrationProfile) -> None:
    """What a CPU calibration must contain, and that fitting it changes the cost model."""
    assert profile.fingerprint.backend == "gloo" and profile.fingerprint.device_count == 2
    assert profile.gpu == "cpu" and profile.model is not None and profile.model.name == "llama-debug"
    assert profile.matmul and profile.memory_bandwidth
    assert {c.op for c in profile.collectives} == {"all_gather", "reduce_scatter", "all_reduce"}
    assert all(c.group_size == 2 and c.link == "intra" for c in profile.collectives)
    assert profile.blocks and {b.checkpointing for b in profile.blocks} <= {"none", "op_selective", "full"}
    # Whole steps of the model cut to one block (at least), sharded over both ranks.
    assert profile.steps and profile.steps[0].num_layers == 1
    assert all(s.ranks == 2 and 0 < s.update_seconds < s.seconds for s in profile.steps)
    # At least one compiled step (SimpleFSDP + torch.compile), however short the budget.
    assert any(s.compile for s in profile.steps) and not profile.steps[0].compile
    for step in profile.steps:
        # Live tensor bytes on CPU: the step's peak holds the persistent state (parameter shards and
        # AdamW state) plus gradients and activations; no caching allocator, so reserved == allocated.
        assert step.memory_source == "cpu_tensor_profile"
        assert step.state_bytes is not None and step.peak_allocated_bytes is not None
        assert step.state_bytes < step.peak_allocated_bytes < 1 << 30
        assert step.peak_reserved_bytes == step.peak_allocated_bytes
    assert profile.usable_memory_bytes is None and profile.device_memory_bytes is None  # CPU
    # `fsdp-planner calibrate` profiles under the launchers' allocator and the profile says so.
    assert profile.allocator_config == os.environ.get("PYTORCH_CUDA_ALLOC_CONF", PRICED_ALLOCATOR_CONFIG)
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    fitted = fit_parameters(profile, base=base, precision="fp32")
    assert fitted.links["intra"] != base.links["intra"]  # measured, not the catalog guess
    assert fitted.memory_bandwidth != base.memory_bandwidth
    assert fitted.optimizer_bytes_per_param != base.optimizer_bytes_per_param  # from the timed updates
    assert fitted.compiled_compute_scale != base.compiled_compute_scale  # from the compiled steps


def test_calibrate_plan_validate_round_trip(
    server: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    runner = CliRunner()
    calibrated = runner.invoke(
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
            "8",
            "--name",
            "ci-loop",
            "-o",
            str(tmp_path / "cpu.json"),
            "--upload",
            server,
        ],
    )
    assert calibrated.exit_code == 0, calibrated.output
    # The profiler's processes write to this process's descriptors (the runner sees only its own).
    printed = capfd.readouterr()
    assert not python_warnings(calibrated.output + printed.out + printed.err), printed.err  # a clean run
    check_profile(CalibrationProfile.model_validate_json((tmp_path / "cpu.json").read_text()))
    profiles = httpx.get(f"{server}/api/v1/calibrations").json()["items"]
    assert [p["name"] for p in profiles] == ["ci-loop"]

    body = {
        "model": "llama-debug",
        "cluster": "1x2xcpu",
        "training": {"seq_len": 128, "global_batch_tokens": 1024, "precision": "fp32"},
        "calibration_id": profiles[0]["id"],
        # Eager keeps this CI run short; compiled launchers are exercised by tests/executor.
        "search": {"compile": [False], "shardings": ["full_shard"]},
    }
    plan = httpx.post(f"{server}/api/v1/plans", json=body, timeout=60)
    assert plan.status_code == 201, plan.text
    plan_id = plan.json()["id"]
    assert plan.json()["plan"]["calibration_id"] == str(profiles[0]["id"])

    validated = runner.invoke(
        app,
        [
            "validate",
            "--plan-id",
            str(plan_id),
            "--server",
            server,
            "--steps",
            "4",
            "--warmup",
            "2",
            "--upload",
        ],
    )
    assert validated.exit_code == 0, validated.output
    printed = capfd.readouterr()
    assert not python_warnings(validated.output + printed.out + printed.err), printed.err
    assert "predicted" in validated.output and "measured" in validated.output

    runs = httpx.get(f"{server}/api/v1/plans/{plan_id}/runs").json()["items"]
    assert len(runs) == 1
    run = runs[0]
    assert run["measured_step_time_s"] > 0 and run["measured_tokens_per_s_per_gpu"] > 0
    assert run["measured_peak_memory_gib"] and run["measured_peak_memory_gib"] > 0
    assert run["predicted_step_time_s"] == pytest.approx(plan.json()["step_time_s"])
    # The dashboard's accuracy page now draws this run instead of its empty state.
    accuracy = httpx.get(f"{server}/accuracy").text
    assert 'id="empty-accuracy"' not in accuracy and "step-time" in accuracy


def test_validate_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(app, ["validate", "--plan", "x.json", "--plan-id", "3"])
    assert both.exit_code == 2 and "exactly one of --plan FILE or --plan-id ID" in both.output
    upload = runner.invoke(app, ["validate", "--plan", "x.json", "--upload"])
    assert upload.exit_code == 2 and "--plan-id" in upload.output
    steps = runner.invoke(app, ["validate", "--plan", "x.json", "--steps", "2", "--warmup", "2"])
    assert steps.exit_code == 2 and "must exceed --warmup" in steps.output
    down = runner.invoke(app, ["validate", "--plan-id", "1", "--server", "http://127.0.0.1:9"])
    assert down.exit_code == 4 and "cannot reach the fsdp-planner server" in down.output
