"""`fsdp-planner validate` reports one step time per run: the trainer's closing line, validate's table
and the number it would store are the same median over the same steady steps."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog.models import resolve_model
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.output_checks import python_warnings

pytestmark = pytest.mark.distributed


def test_validate_prints_one_step_time_consistent_with_the_metrics(tmp_path: Path) -> None:
    request = PlanRequest(
        model=resolve_model("llama-debug"), cluster=ClusterSpec.parse("1x2xcpu"),
        training=TrainingSpec(seq_len=64, global_batch_tokens=512, precision="fp32"),
        # Eager keeps the run short (no compilation); the statistic is the same for compiled plans.
        search=SearchSpace(compile=[False], shardings=["full_shard"]),
    )
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(make_plan(request).model_dump_json())
    keep = tmp_path / "keep"
    result = subprocess.run(
        [sys.executable, "-m", "api.cli.main", "validate", "--plan", str(plan_file),
         "--steps", "5", "--warmup", "2", "--keep", str(keep)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not python_warnings(result.stdout + result.stderr), result.stderr  # a clean run
    out = result.stdout

    steps = [json.loads(line) for line in (keep / "metrics.jsonl").read_text().splitlines()]
    median = statistics.median(s["step_time_s"] for s in steps[2:])

    done = re.findall(r"median step time ([\d.e+-]+) s over steps 3-5 \(after 2 warm-up\)", out)
    assert len(done) == 1, out
    assert float(done[0]) == pytest.approx(median, rel=1e-3)

    row = re.findall(r"step time \(median, steps 3-5\)\s*│\s*\S+ \S+\s*│\s*([\d.,]+) (µs|ms|s|min)\b", out)
    assert len(row) == 1, out
    value, unit = row[0]
    scale = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}[unit]
    assert float(value.replace(",", "")) * scale == pytest.approx(median, rel=5e-3)
    # Throughput and peak beside their 80% intervals, and whether the measurement fell inside.
    assert re.search(r"tokens/s/GPU\s*│\s*[\d,]+ \([\d,]+–[\d,]+\)\s*│\s*[\d,]+\s*│\s*[+-][\d.]+%, "
                     r"(inside|OUTSIDE) 80%", out), out
    assert re.search(r"peak memory\s*│\s*[\d.]+ GiB \([\d.]+–[\d.]+\)\s*│", out), out
    # Every step's progress line gives its time in seconds too.
    assert len(re.findall(r"^step \d/5 \|.*\| [\d.]+ s \|", out, re.M)) == 5, out
    # No other summary step time: the old trainer line ("steady step ... s", a mean) is gone.
    assert not re.search(r"steady step [\d.]+ s", out)
