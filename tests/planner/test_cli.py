"""`fsdp-planner plan` end to end through the console entry point."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from api.cli.main import app
from planner.plan import SCHEMA_VERSION
from tests.planner.test_specs import HF_LLAMA3

runner = CliRunner()


def test_plan_catalog_model_prints_a_table() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "8192",
            "--global-batch-tokens",
            str(8192 * 16),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Chosen:" in result.output and "tokens/s/GPU" in result.output
    assert "Why the other families lost" in result.output


def test_plan_json_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "gpt2",
            "--cluster",
            "1x2xcpu",
            "--seq-len",
            "256",
            "--global-batch-tokens",
            "2048",
            "--json",
            "-o",
            str(out),
            "--top",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads(out.read_text())
    assert printed["model"]["name"] == "gpt2" and printed["schema_version"] == SCHEMA_VERSION
    assert len(printed["alternatives"]) <= 3


def test_plan_from_hf_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_LLAMA3))
    result = runner.invoke(
        app,
        [
            "plan",
            "--hf-config",
            str(config),
            "--cluster",
            "2x8xH100",
            "--seq-len",
            "4096",
            "--global-batch-tokens",
            str(4096 * 64),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"]["num_params"] == 8_030_261_248


def test_plan_with_cluster_file_and_calibration(tmp_path: Path) -> None:
    from tests.planner.test_calibration import synthetic_profile

    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"num_nodes": 1, "gpus_per_node": 8, "gpu": "H100"}))
    profile = tmp_path / "h100.json"
    profile.write_text(
        json.dumps(synthetic_profile(efficiency=0.45, overhead=1e-5, latency=2e-5, bandwidth=3e11))
    )
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster-file",
            str(cluster),
            "--seq-len",
            "4096",
            "--global-batch-tokens",
            str(4096 * 8),
            "--calibration",
            str(profile),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["calibration_id"] == "synthetic"


def test_errors_are_one_clear_line_not_a_traceback(tmp_path: Path) -> None:
    bad = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "8192",
            "--global-batch-tokens",
            "1000",
        ],
    )
    assert bad.exit_code == 2
    assert "global_batch_tokens" in bad.output and "Traceback" not in bad.output
    unknown = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "1x8xV9000",
            "--seq-len",
            "512",
            "--global-batch-tokens",
            "4096",
        ],
    )
    assert unknown.exit_code == 2 and "unknown GPU 'V9000'" in unknown.output
    t5 = tmp_path / "t5.json"
    t5.write_text(json.dumps({"architectures": ["T5ForConditionalGeneration"]}))
    arch = runner.invoke(
        app,
        [
            "plan",
            "--hf-config",
            str(t5),
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "512",
            "--global-batch-tokens",
            "4096",
        ],
    )
    assert arch.exit_code == 2 and "unsupported architecture T5ForConditionalGeneration" in arch.output
    too_big = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3.1-405b",
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "4096",
            "--global-batch-tokens",
            str(4096 * 64),
        ],
    )
    assert too_big.exit_code == 3 and "Smallest cluster that fits" in too_big.output
