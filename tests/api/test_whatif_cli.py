"""`fsdp-planner whatif`: planned here in parallel, printed as a table or JSON; bad options explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app

runner = CliRunner()
GPT2 = ["whatif", "--model", "gpt2", "--tokens", "10B", "--seq-len", "1024",
        "--global-batch-tokens", "262144"]


def test_json_study_with_the_arithmetic_and_the_picks() -> None:
    result = runner.invoke(app, [*GPT2, "--gpu", "H100=2.5", "--gpu", "A100", "--sizes", "1,8,12",
                                 "--deadline-days", "2", "--json"])
    assert result.exit_code == 0, result.output
    study = json.loads(result.stdout)
    points = study["points"]
    assert [(p["gpu"], p["num_gpus"], p["fits"]) for p in points] == [
        ("H100-SXM-80GB", 1, True), ("H100-SXM-80GB", 8, True), ("H100-SXM-80GB", 12, False),
        ("A100-80GB", 1, True), ("A100-80GB", 8, True), ("A100-80GB", 12, False),
    ]
    for p in (p for p in points if p["fits"]):
        seconds = 10e9 / p["tokens_per_s"]
        assert p["days"] == pytest.approx(seconds / 86400, rel=1e-12)
        assert p["cost"] == pytest.approx(p["num_gpus"] * seconds / 3600 * p["price_per_gpu_hour"], rel=1e-12)
    assert study["request"]["deadline_days"] == 2.0
    assert points[study["cheapest"]]["cost"] == min(p["cost"] for p in points if p["fits"])


def test_table_marks_the_picks_and_says_why_clusters_do_not_fit() -> None:
    result = runner.invoke(app, [*GPT2, "--gpu", "H100", "--sizes", "8-32", "--deadline-days", "0.001"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "gpt2 on 10B tokens" in result.output
    assert "cheapest" in result.output and "pareto" in result.output
    assert "No cluster trains within 0.001 days" in result.output
    short = runner.invoke(app, [*GPT2, "--gpu", "H100", "--sizes", "12"], env={"COLUMNS": "200"})
    reason = "12xH100-SXM-80GB (12 GPUs): 12 GPUs is not a whole number of 8-GPU H100-SXM-80GB nodes"
    assert reason in short.output


@pytest.mark.parametrize(("args", "message"), [
    (["--sizes", "8"], "give at least one candidate GPU type"),
    (["--gpu", "H100=free"], "the price after '=' must be USD per GPU-hour"),
    (["--gpu", "H100=0"], "greater than 0"),
    (["--gpu", "H100", "--sizes", "8-"], "--sizes: cannot read '8-'"),
    (["--gpu", "H100", "--tokens", "lots"], "--tokens: cannot read 'lots' as a token count"),
    (["--gpu", "H100", "--sizes", "64-8"], "the range from 64 to 8 GPUs is empty"),
    (["--gpu", "Z9"], "unknown GPU 'Z9'"),
])
def test_bad_options_are_explained(args: list[str], message: str) -> None:
    result = runner.invoke(app, [*GPT2, *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_stored_calibration_needs_the_server(tmp_path: Path) -> None:
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text(json.dumps({"gpu": "H100", "calibration_id": 3}))
    result = runner.invoke(app, [*GPT2, "--gpu-file", str(gpu_file)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "add --server URL to plan there" in result.output
