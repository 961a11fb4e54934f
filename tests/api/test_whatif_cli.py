"""`fsdp-planner whatif`: planned here in parallel, printed as a table or JSON; bad options explained; a
study on a server followed to its end, a failed one with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from api.cli import whatif_cmd
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


def test_bf16_and_float8_side_by_side() -> None:
    llama = ["whatif", "--model", "llama3-8b", "--tokens", "1T", "--seq-len", "8192",
             "--global-batch-tokens", str(8192 * 64), "--sizes", "8,16"]
    result = runner.invoke(app, [*llama, "--gpu", "H100", "--gpu", "H100+tensorwise", "--gpu", "A100+rowwise",
                                 "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)["points"]
    by = {(p["gpu"], p["float8"], p["num_gpus"]): p for p in points}
    for size in (8, 16):
        bf16, fp8 = by[("H100-SXM-80GB", "none", size)], by[("H100-SXM-80GB", "tensorwise", size)]
        assert "fp8-tensorwise" in fp8["config_label"] and "fp8" not in bf16["config_label"]
        assert fp8["tokens_per_s"] > bf16["tokens_per_s"] and fp8["cost"] < bf16["cost"]
        refused = by[("A100-80GB", "rowwise", size)]
        assert not refused["fits"] and "the A100-80GB has no float8 tensor cores" in refused["reason"]
    table = runner.invoke(app, [*llama, "--gpu", "H100", "--gpu", "H100+tensorwise"], env={"COLUMNS": "240"})
    assert "H100-SXM-80GB fp8-tensorwise" in table.stdout
    bad = runner.invoke(app, [*llama, "--gpu", "H100+fp4"])
    assert bad.exit_code == 2 and "after '+' comes a Float8 recipe" in bad.stderr


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



def test_every_row_gives_its_80_percent_intervals() -> None:
    # tok/s/GPU, peak GiB and days each with their interval in brackets, as the JSON points state them.
    args = ["whatif", "--model", "gpt2", "--tokens", "10T", "--seq-len", "1024", "--global-batch-tokens",
            "262144", "--gpu", "H100", "--sizes", "8,16"]
    study = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "In brackets: the 80% interval" in result.output
    for point in study["points"]:
        t, m, d = (point[f"{name}_interval"] for name in ("tokens_per_s_per_gpu", "peak_memory_gib", "days"))
        assert d["low"] < point["days"] < d["high"]
        line = next(line for line in result.output.splitlines() if f"{point['num_gpus']} (" in line)
        assert f"{point['tokens_per_s_per_gpu']:,.0f} ({t['low']:,.0f}–{t['high']:,.0f})" in line
        assert f"{point['peak_memory_gib']:.1f} ({m['low']:.1f}–{m['high']:.1f})" in line
        assert f"{point['days']:,.1f} ({d['low']:,.1f}–{d['high']:,.1f})" in line


@pytest.mark.parametrize(("args", "message"), [
    (["--sizes", "8"], "give at least one candidate GPU type"),
    (["--gpu", "H100=free"], "the price after '=' must be USD per GPU-hour"),
    (["--gpu", "H100=0"], "out of range: give more than 0 and at most 10,000 USD per GPU-hour"),
    (["--gpu", "H100", "--sizes", "8-"], "--sizes: cannot read '8-'"),
    (["--gpu", "H100", "--tokens", "lots"], "--tokens: cannot read 'lots' as a token count"),
    (["--gpu", "H100", "--sizes", "64-8"], "the range from 64 to 8 GPUs is empty"),
    (["--gpu", "Z9"], "unknown GPU 'Z9'"),
])
def test_bad_options_are_explained(args: list[str], message: str) -> None:
    result = runner.invoke(app, [*GPT2, *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--sizes", "{d}"], "--sizes: cannot read '{d}'; write a list (64,128,512), a doubling range (8-4096) "
                         "or a stepped range (64-512:+64), in ASCII digits"),
    (["--sizes", "{d},{d}"], "--sizes: cannot read '{d},{d}'; write a list"),
    (["--sizes", "8-{d}"], "--sizes: cannot read '8-{d}'; write a list"),
    (["--tokens", "{d}"], "--tokens: cannot read '{d}' as a token count"),
    (["--gpu", "H100={d}"],
     "--gpu 'H100={d}': the price after '=' must be USD per GPU-hour in the digits 0-9"),
])
@pytest.mark.parametrize("digit", ["\u00b2", "\u0663"])  # '²' (int() refused it) and '٣' (read as 3)
def test_numbers_in_other_scripts_digits_are_refused_in_one_line(
    args: list[str], message: str, digit: str
) -> None:
    result = runner.invoke(app, [*GPT2, "--gpu", "H100", *(arg.replace("{d}", digit) for arg in args)],
                           env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message.replace('{d}', digit)}"), result.output


def test_a_stored_calibration_needs_the_server(tmp_path: Path) -> None:
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text(json.dumps({"gpu": "H100", "calibration_id": 3}))
    result = runner.invoke(app, [*GPT2, "--gpu-file", str(gpu_file)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "add --server URL to plan there" in result.output


class _Server:
    """Answers GET /studies/{id} with the next of `states` (what `whatif --server` follows)."""

    server = "http://planner.test"

    def __init__(self, *studies: dict[str, Any]) -> None:
        self.studies = list(studies)

    def get(self, path: str, *, not_found: str | None = None) -> dict[str, Any]:
        assert path == "/studies/7" and not_found
        return self.studies.pop(0)


def _study(state: str, done: int, error: str | None = None) -> dict[str, Any]:
    return {"id": 7, "state": state, "num_candidates": 4, "candidates_done": done, "num_fitting": done // 2,
            "error": error}


def test_server_studies_are_followed_to_the_end_and_a_failure_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(whatif_cmd, "POLL_INTERVAL_S", 0.0)
    server = _Server(_study("running", 2), _study("succeeded", 4))
    finished = whatif_cmd.follow_study(server, _study("queued", 0))  # type: ignore[arg-type]
    assert finished["state"] == "succeeded" and server.studies == []

    failing = _Server(_study("running", 1), _study("failed", 1, "calibration profile 3 does not exist"))
    with pytest.raises(typer.Exit) as exited:
        whatif_cmd.follow_study(failing, _study("queued", 0))  # type: ignore[arg-type]
    assert exited.value.exit_code == 1
    assert "study 7 failed on the server: calibration profile 3 does not exist" in capsys.readouterr().err
    with pytest.raises(typer.Exit):
        whatif_cmd.follow_study(_Server(_study("cancelled", 1)), _study("running", 0))  # type: ignore[arg-type]
    assert "was cancelled on the server" in capsys.readouterr().err


@pytest.mark.parametrize("digit", ["٣", "²", "३"])
@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--global-batch-tokens", "65536"], "--seq-len"),
        (["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq-len", "1024"], "--global-batch-tokens"),
        (["whatif", "--model", "gpt2", "--gpu", "H100", "--global-batch-tokens", "65536"], "--deadline-days"),
        (["serve"], "--port"),
        (["replan"], None),
    ],
)
def test_number_options_read_ascii_digits_only(command: list[str], option: str | None, digit: str) -> None:
    # int() reads '٣' (Arabic-Indic) and '३' (Devanagari) as 3: every number option refuses them, as
    # the API's schemas and the dashboard's forms do, naming the option and the digits it reads.
    typed = [option, f"1{digit}"] if option else [f"1{digit}"]
    result = runner.invoke(app, [*command, *typed], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "in the digits 0-9" in result.output and f"'1{digit}'" in result.output, result.output


def test_a_candidate_states_its_scale_up_domain_as_the_cluster_text_counts_it() -> None:
    # `36xGB200` is one NVL36 domain, read as `--cluster` reads it; the plans run in domains of 36.
    args = ["whatif", "--model", "gpt2", "--tokens", "10B", "--seq-len", "1024", "--global-batch-tokens",
            str(1024 * 288), "--sizes", "72,144", "--gpu", "GB200", "--gpu", "36xGB200=5", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    study = json.loads(result.stdout)
    candidate = study["request"]["gpus"][1]
    assert (candidate["gpus_per_node"], candidate["scaleup_domain_gpus"]) == (4, 36)
    by = {(p["scaleup_domain_gpus"], p["num_gpus"]): p for p in study["points"]}
    assert by[(None, 72)]["fits"] and by[(36, 72)]["fits"] and by[(36, 144)]["fits"]
    assert by[(36, 144)]["num_nodes"] == 36 and by[(36, 144)]["gpus_per_node"] == 4
    table = runner.invoke(app, args[:-1], env={"COLUMNS": "240"})
    assert "GB200 (domains of 36)" in table.stdout
    for typed, message in (("2x36xGB200", "give the GPUs of one node or one scale-up domain"),
                           ("30xGB200", "30 GPUs is not a whole number of GB200's 4-GPU nodes")):
        bad = runner.invoke(app, [*GPT2, "--gpu", typed], env={"COLUMNS": "400"})
        assert bad.exit_code == 2 and f"--gpu '{typed}': {message}" in bad.output, bad.output
