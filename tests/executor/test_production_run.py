"""Issue 14's run end to end, as a platform team would do it, on CPU gloo.

Prepare a small text corpus into memory-mapped shards (`fsdp-planner prepare-data`), start from a
tiny Hugging Face safetensors checkpoint (`--init-from`), train with periodic checkpoints and held-out
evaluation, kill the job hard (SIGKILL, no chance to save) after a checkpoint, resume it, and match
the uninterrupted run's loss curve step for step.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from tests.executor.conftest import REPO, explain, job_env, read_metrics, torchrun
from tests.executor.hf_checkpoint import LLAMA_CONFIG, plan_model, random_weights, write_checkpoint
from tests.executor.plan_factory import debug_plan

pytestmark = pytest.mark.distributed

STEPS = 120
CHECKPOINT_EVERY = 10
EVAL_EVERY = 40
# The byte tokenizer's vocabulary is 257 (bytes + end of document); the model's must hold it.
CONFIG = {**LLAMA_CONFIG, "vocab_size": 264}


def _corpus(path: Path) -> Path:
    paragraphs = [
        f"Paragraph {i}: the shard holds tokens of document {i % 7}, "
        f"and the model reads {'sequences ' * (1 + i % 5)}until the step ends."
        for i in range(400)
    ]
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


def _process_tree(root: int) -> list[int]:
    """`root` and every process below it (read from /proc: no psutil needed)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after its closing bracket.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _train_command(plan: Path, data: Path, weights: Path, ckpt: Path, metrics: Path) -> list[str]:
    return [
        "-m", "executor.runtime.train",
        "--plan", str(plan),
        "--data", str(data),
        "--init-from", str(weights),
        "--steps", str(STEPS),
        "--checkpoint-dir", str(ckpt),
        "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--keep-checkpoints", "0",
        "--resume",
        "--eval-every", str(EVAL_EVERY),
        "--eval-batches", "2",
        "--lr", "1e-3",
        "--warmup", "2",
        "--metrics-file", str(metrics),
    ]


def test_prepared_data_pretrained_weights_kill_and_resume_match_the_uninterrupted_run(tmp_path: Path) -> None:
    # 1. Data: text -> shards + index.json, with an eval split.
    data = tmp_path / "data"
    prepared = CliRunner().invoke(
        app,
        ["prepare-data", str(_corpus(tmp_path / "corpus.txt")), "--out", str(data), "--tokenizer", "bytes",
         "--sample-by", "paragraph", "--eval-fraction", "0.1", "--shard-tokens", "8000"],
    )
    assert prepared.exit_code == 0, prepared.output
    index = json.loads((data / "index.json").read_text())
    assert len(index["splits"]["train"]["shards"]) > 1  # sequences cross shard boundaries

    # 2. Weights: a tiny Llama written as a Hugging Face checkpoint, in two safetensors shards.
    weights = write_checkpoint(
        tmp_path / "hf", CONFIG, random_weights(CONFIG, seed=3), max_shard_bytes=100_000
    )
    plan_doc = debug_plan(model=plan_model(CONFIG), seq_len=32, micro_batch_size=2, grad_accum_steps=2)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_doc))

    # 3. The uninterrupted run.
    straight = tmp_path / "straight.jsonl"
    result = torchrun(2, _train_command(plan, data, weights, tmp_path / "ckpt-straight", straight))
    assert result.returncode == 0, explain(result)
    expected = read_metrics(straight)
    assert [r["step"] for r in expected] == list(range(1, STEPS + 1))
    assert all(r["synthetic_data"] is False for r in expected)
    evals = [r["eval_loss"] for r in expected if r.get("eval_loss") is not None]
    assert len(evals) == STEPS // EVAL_EVERY and evals[-1] < evals[0]

    # 4. The same job killed hard once a checkpoint (not the last) is complete, then started again.
    ckpt, interrupted = tmp_path / "ckpt", tmp_path / "interrupted.jsonl"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               *_train_command(plan, data, weights, ckpt, interrupted)]
    job = subprocess.Popen(command, cwd=REPO, env=job_env(), start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (ckpt / f"step-{CHECKPOINT_EVERY:08d}").is_dir():
        assert job.poll() is None, job.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "no checkpoint in 300 s"
        time.sleep(0.05)
    # As a node failure would: every process at once, the ranks included (torchrun starts each rank
    # in a session of its own, so a signal to its process group would not reach them).
    for pid in _process_tree(job.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait()
    saved = sorted(p.name for p in ckpt.iterdir() if not p.name.endswith(".partial"))
    assert saved[-1] != f"step-{STEPS:08d}", f"the kill came too late to interrupt the run: {saved}"

    resumed = tmp_path / "resumed.jsonl"
    result = torchrun(2, _train_command(plan, data, weights, ckpt, resumed))
    assert result.returncode == 0, explain(result)
    assert "resumed from" in result.stdout, explain(result)
    assert resumed.exists(), explain(result) + f"\nsaved before the kill: {saved}"
    after = read_metrics(resumed)
    first = after[0]["step"]
    assert first > CHECKPOINT_EVERY and first % CHECKPOINT_EVERY == 1 and after[-1]["step"] == STEPS
    # The resumed steps are the uninterrupted run's, to float32 reduction order.
    assert [r["loss"] for r in after] == pytest.approx([r["loss"] for r in expected[first - 1:]], rel=1e-5)
