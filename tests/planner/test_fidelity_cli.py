"""`fsdp-planner fidelity` through the console entry point (without leave-one-source-out: it is slow)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from api.cli.main import app
from planner.fidelity.schema import load_corpus

runner = CliRunner()


def test_json_has_every_corpus_run_priced_or_with_its_reason(tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    result = runner.invoke(app, ["fidelity", "--no-loso", "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert json.loads(out.read_text()) == report
    corpus = {(f.source.id, run.id) for f in load_corpus() for run in f.runs}
    assert {(r["source"], r["run_id"]) for r in report["runs"]} == corpus
    assert all(r["priced"] or r["reason"] for r in report["runs"])
    assert all(r["loso_throughput_error"] is None for r in report["runs"])  # --no-loso
    assert report["targets"] and report["by_gpu"]


def test_tables_list_the_summaries_targets_and_with_runs_every_run() -> None:
    result = runner.invoke(app, ["fidelity", "--no-loso", "--runs"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for title in ("Per GPU type", "Per source", "Per quantity", "Targets", "Runs"):
        assert title in result.stdout
    assert "H100-SXM-80GB" in result.stdout and "not priced:" in result.stdout
    assert ("met" in result.stdout) or ("missed" in result.stdout)
