"""The README's CPU example plans fp32 (what CPU runs train in); a bf16 plan for CPU says why it will
not predict the run, on stderr, so `--json` output stays a plan."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from api.cli.main import app

# The README's launcher example, without and with its --precision.
README_CPU_PLAN = ["plan", "--model", "llama-debug", "--cluster", "1x2xcpu", "--seq-len", "64",
                   "--global-batch-tokens", "512", "--json"]


def test_the_readme_cpu_example_plans_what_cpu_runs_train_in() -> None:
    result = CliRunner().invoke(app, [*README_CPU_PLAN, "--precision", "fp32"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["training"]["precision"] == "fp32" and plan["config"]["param_dtype"] == "float32"
    assert "note:" not in result.stderr


def test_a_bf16_cpu_plan_carries_a_note() -> None:
    result = CliRunner().invoke(app, README_CPU_PLAN)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["training"]["precision"] == "bf16"
    assert "CPU runs train in float32" in result.stderr and "--precision fp32" in result.stderr


def test_a_gpu_plan_has_no_cpu_note() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq-len", "512",
                                      "--global-batch-tokens", "4096"])
    assert result.exit_code == 0, result.output
    assert "CPU runs" not in result.output
