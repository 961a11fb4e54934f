"""Evaluation in a compiled run compiles nothing new.

The README's compiled llama-debug bundle, rendered as a user would (`fsdp-planner plan`, then
`fsdp-planner launcher`), run through its own `launch.sh` on 2 CPU ranks with an evaluation every
other step. Its evaluations used to compile a forward-only graph in the middle of the run (30-65 s on
a loaded machine); they now run the training graph. Four evaluations in one run, and dynamo's
recompilation log must stay silent: a new graph at any of them fails the test at once.
`bench/launcher_eval_repeats.py` repeats the whole run on a loaded machine. (The heap corruption that
killed about one such run in twenty was gloo's two worker threads running all-gathers side by side:
tests/executor/test_cpu_process_groups.py, bench/gloo_in_flight.py.)
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from tests.executor.conftest import explain, read_metrics

pytestmark = pytest.mark.distributed

STEPS, EVAL_EVERY = 8, 2


def render_bundle(tmp_path: Path) -> Path:
    """The README's launcher example (a compiled plan: compile is the planner's pick here)."""
    runner = CliRunner()
    plan = runner.invoke(app, ["plan", "--model", "llama-debug", "--cluster", "1x2xcpu", "--seq-len", "64",
                               "--global-batch-tokens", "512", "--precision", "fp32",
                               "-o", str(tmp_path / "plan.json")])
    assert plan.exit_code == 0, plan.output
    launcher = runner.invoke(app, ["launcher", "--plan", str(tmp_path / "plan.json"), "--target", "torchrun",
                                   "-o", str(tmp_path / "bundles")])
    assert launcher.exit_code == 0, launcher.output
    (bundle,) = [p for p in (tmp_path / "bundles").iterdir() if p.is_dir()]
    return bundle


def test_a_compiled_bundle_evaluates_through_its_training_graph(tmp_path: Path) -> None:
    bundle = render_bundle(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPROC_PER_NODE", "NNODES")}
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", SYNTHETIC_DATA="1", TORCH_LOGS="recompiles")
    # Scalar C++ kernels compile faster on a 2-core machine (tests/executor/conftest.py job_env); which
    # graphs dynamo traces, and whether an evaluation recompiles, do not depend on the kernels' ISA.
    env.update(TORCHINDUCTOR_VEC_ISA_OK="0")
    metrics = tmp_path / "metrics.jsonl"
    result = subprocess.run(
        ["./launch.sh", "--steps", str(STEPS), "--eval-every", str(EVAL_EVERY), "--eval-batches", "2",
         "--metrics-file", str(metrics)],
        cwd=bundle, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert result.returncode == 0, explain(result)
    assert "torch.compile backend=inductor" in result.stdout, explain(result)  # a compiled run
    assert "Recompiling" not in result.stdout + result.stderr, explain(result)
    evals = {r["step"]: r["eval_loss"] for r in read_metrics(metrics) if r["eval_loss"] is not None}
    assert sorted(evals) == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
    assert all(math.isfinite(loss) and 0 < loss < 10 for loss in evals.values()), evals
