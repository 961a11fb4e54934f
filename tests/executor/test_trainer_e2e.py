"""End to end on CPU: a real plan's bundle trains through its own launch.sh; checkpoints resume
exactly; a job that does not match the plan's world size is refused with a clear message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from executor.launch.bundle import bundle_name, write_bundle
from planner.catalog.models import catalog_model
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.executor.conftest import REPO, explain, job_env, read_metrics, torchrun
from tests.executor.plan_factory import debug_plan
from tests.output_checks import python_warnings

TRAIN = ["-m", "executor.runtime.train"]


@pytest.mark.distributed
def test_bundle_trains_through_its_own_launch_sh(tmp_path: Path) -> None:
    # A real plan from the planner for llama-debug on 1x2 cpu (eager: compiled runs are covered by
    # test_parity; here the bundle mechanics are under test).
    request = PlanRequest(
        model=catalog_model("llama-debug"),
        cluster=ClusterSpec.parse("1x2xcpu"),
        training=TrainingSpec(seq_len=64, global_batch_tokens=64 * 8, precision="fp32"),
        search=SearchSpace(compile=[False]),
    )
    plan = make_plan(request)
    write_bundle(plan, tmp_path / "out", target="all")
    # Run it where only the bundle is: a copy outside the repository, no PYTHONPATH to our code.
    bundle = tmp_path / "elsewhere" / "bundle"
    shutil.copytree(tmp_path / "out" / bundle_name(plan), bundle)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPROC_PER_NODE", "NNODES")}
    # The rehearsal on synthetic tokens, asked for by name (the loss falls fast on them).
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", SYNTHETIC_DATA="1")
    metrics = tmp_path / "metrics.jsonl"
    result = subprocess.run(
        ["./launch.sh", "--steps", "16", "--lr", "2e-3", "--metrics-file", str(metrics)],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, explain(result)
    assert "done: 16 steps" in result.stdout
    assert not python_warnings(result.stdout + result.stderr), explain(result)  # a clean run
    assert "WARNING: training on SYNTHETIC tokens" in result.stdout
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == list(range(1, 17))
    for r in records:
        assert r["tokens_per_s_per_gpu"] > 0 and r["step_time_s"] > 0 and r["mfu"] > 0
    assert records[-1]["peak_memory_gib"] > 0 and records[-1]["memory_source"] == "cpu_tensor_profile"
    assert all(r["synthetic_data"] is True and r["eval_loss"] is None for r in records)
    first, last = records[0]["loss"], sum(r["loss"] for r in records[-4:]) / 4
    assert first > 7.0 and last < first - 1.5, [r["loss"] for r in records]
    # The trainer ran from the bundle's copy of the runtime, not from this repository.
    assert f"runtime {bundle / 'executor' / 'runtime'}" in result.stdout


def _train(plan: Path, tmp: Path, name: str, *extra: str, nproc: int = 2) -> list[dict]:
    metrics = tmp / f"{name}.jsonl"
    if "--data" not in extra:
        extra = ("--synthetic-data", *extra)
    result = torchrun(
        nproc,
        [
            *TRAIN,
            "--plan",
            str(plan),
            "--metrics-file",
            str(metrics),
            "--lr",
            "1e-3",
            "--warmup",
            "2",
            *extra,
        ],
    )
    assert result.returncode == 0, explain(result)
    return read_metrics(metrics)


@pytest.mark.distributed
def test_checkpoint_resume_reproduces_uninterrupted_run(tmp_path: Path, write_plan) -> None:
    # Gradient accumulation (2 micro-batches) so the data position inside a step matters too.
    plan = write_plan(debug_plan(sharding="full_shard", micro_batch_size=1, grad_accum_steps=2))
    ckpt = tmp_path / "ckpt"
    # 8 uninterrupted steps (saving does not disturb training), checkpoints at 4 and 8.
    straight = _train(
        plan,
        tmp_path,
        "straight",
        "--steps",
        "8",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "4",
        "--keep-checkpoints",
        "0",
    )
    # Make step 8's checkpoint disappear: resume must pick the newest complete one, step 4.
    shutil.rmtree(ckpt / "step-00000008")
    shutil.copytree(ckpt, tmp_path / "ckpt-simple")
    resumed = _train(plan, tmp_path, "resumed", "--steps", "8", "--checkpoint-dir", str(ckpt), "--resume")
    assert [r["step"] for r in resumed] == [5, 6, 7, 8]
    expected = [r["loss"] for r in straight]
    assert [r["loss"] for r in resumed] == pytest.approx(expected[4:], rel=1e-6)
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in straight[4:]], rel=1e-9)
    # The same checkpoint (FSDP2 wrote it) resumes under SimpleFSDP: parameter names and DTensor
    # shards are engine-independent.
    simple = _train(
        plan,
        tmp_path,
        "simple",
        "--steps",
        "8",
        "--checkpoint-dir",
        str(tmp_path / "ckpt-simple"),
        "--resume",
        "--engine",
        "simple_fsdp",
        "--no-compile",
    )
    assert [r["loss"] for r in simple] == pytest.approx(expected[4:], rel=1e-4)


@pytest.mark.distributed
def test_tensor_parallel_plan_trains_like_one_rank(tmp_path: Path, write_plan) -> None:
    # dp 2 x tp 2: the trainer hands each tp group one data-parallel share of the batch (2
    # micro-batches of 1 sequence), so its losses are those of one rank taking all 4 sequences
    # (fp32; tp only reorders sums, see test_tensor_parallel).
    tp = write_plan(debug_plan(gpus_per_node=4, tp=2, micro_batch_size=1, grad_accum_steps=2), "tp.json")
    one = write_plan(debug_plan(gpus_per_node=1, micro_batch_size=2, grad_accum_steps=2), "one.json")
    sharded = _train(tp, tmp_path, "tp", "--steps", "4", nproc=4)
    single = _train(one, tmp_path, "one", "--steps", "4", nproc=1)
    assert [r["loss"] for r in sharded] == pytest.approx([r["loss"] for r in single], rel=2e-5)
    assert [r["grad_norm"] for r in sharded] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)
    # Per GPU: a step's tokens over all 4 ranks (the tp pair shares its tokens and splits the FLOPs).
    for r in sharded:
        assert r["tokens_per_s_per_gpu"] == pytest.approx(4 * 64 / 4 / r["step_time_s"], rel=1e-6)


EVALS = ("--steps", "4", "--eval-every", "2", "--eval-batches", "1")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The one-rank run the cp, pp and pp x cp plans are held to (2 micro-batches of 1 sequence, 4
    steps, evaluated every 2): the same launch for each of them, so it runs once per module."""
    tmp = tmp_path_factory.mktemp("one-rank")
    one = tmp / "one.json"
    one.write_text(json.dumps(debug_plan(gpus_per_node=1, micro_batch_size=1, grad_accum_steps=2)))
    return _train(one, tmp, "one", *EVALS, nproc=1)


def _trains_like_one_rank(
    split_plan: Path, tmp_path: Path, single: list[dict], name: str, nproc: int = 2
) -> None:
    """`nproc` ranks of `split_plan` log one rank's (`single`'s) losses, gradient norms and held-out
    losses (2 micro-batches of 1 sequence, 4 steps, evaluated every 2)."""
    split = _train(split_plan, tmp_path, name, *EVALS, nproc=nproc)
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in single], rel=2e-5)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)
    evaluated = [(r["step"], r["eval_loss"]) for r in split if r.get("eval_loss") is not None]
    assert [step for step, _ in evaluated] == [2, 4]
    expected = [r["eval_loss"] for r in single if r.get("eval_loss") is not None]
    assert [loss for _, loss in evaluated] == pytest.approx(expected, rel=2e-5)


@pytest.mark.distributed
def test_context_parallel_plan_trains_like_one_rank(tmp_path: Path, write_plan, one_rank: list[dict]) -> None:
    # cp 2: both ranks read the same 2 micro-batches of 1 sequence and keep half of each; the
    # trainer's losses (each rank logs its cp group's mean), gradient norms and held-out losses are
    # those of one rank taking the whole sequences (fp32; cp only reorders sums, see
    # test_context_parallel).
    cp = write_plan(debug_plan(gpus_per_node=2, cp=2, micro_batch_size=1, grad_accum_steps=2), "cp.json")
    _trains_like_one_rank(cp, tmp_path, one_rank, "cp")


@pytest.mark.distributed
def test_pipeline_parallel_plan_trains_like_one_rank(
    tmp_path: Path, write_plan, one_rank: list[dict]
) -> None:
    # pp 2 (1F1B, two stages of 2 blocks): both ranks read the same 2 micro-batches of 1
    # sequence, the first stage takes the inputs, the last the targets and the loss; the logged
    # losses (the last stage's), the gradient norms (clipped over both stages) and the held-out
    # losses (the schedule's forward-only pass) are one rank's (fp32: see test_pipeline_parallel).
    pipeline = {"schedule": "1F1B", "stages_per_rank": 1, "stage_blocks": [2, 2]}
    pp = write_plan(
        debug_plan(gpus_per_node=2, micro_batch_size=1, grad_accum_steps=2, pipeline=pipeline), "pp.json"
    )
    _trains_like_one_rank(pp, tmp_path, one_rank, "pp")


@pytest.mark.distributed
def test_pipeline_with_context_parallel_plan_trains_like_one_rank(
    tmp_path: Path, write_plan, one_rank: list[dict]
) -> None:
    # pp 2 x cp 2 on 4 ranks, cp inside each stage: the first stage's cp ranks keep half of each
    # sequence, the last stage's log their cp group's mean loss (the logged mean is over the last
    # stage's ranks); losses, gradient norms and held-out losses are still one rank's.
    pipeline = {"schedule": "1F1B", "stages_per_rank": 1, "stage_blocks": [2, 2]}
    document = debug_plan(gpus_per_node=4, cp=2, micro_batch_size=1, grad_accum_steps=2, pipeline=pipeline)
    both = write_plan(document, "ppcp.json")
    _trains_like_one_rank(both, tmp_path, one_rank, "ppcp", nproc=4)


def test_world_size_mismatch_is_a_clear_error(write_plan) -> None:
    plan = write_plan(debug_plan(nodes=1, gpus_per_node=2))
    env = job_env(WORLD_SIZE="3")
    result = subprocess.run(
        [sys.executable, *TRAIN, "--plan", str(plan), "--steps", "1", "--synthetic-data"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = result.stderr
    assert "this plan is for 2 ranks" in message and "WORLD_SIZE=3" in message
    assert "NPROC_PER_NODE" in message and "1 node(s) x 2 x cpu" in message


def test_bad_plan_is_a_clear_error(write_plan, tmp_path: Path) -> None:
    doc = debug_plan()
    doc["schema_version"] = "3.0"
    result = subprocess.run(
        [sys.executable, *TRAIN, "--plan", str(write_plan(doc)), "--steps", "1", "--synthetic-data"],
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "schema 1.x and 2.x" in result.stderr and "3.0" in result.stderr
    missing = subprocess.run(
        [sys.executable, *TRAIN, "--plan", str(tmp_path / "nope.json"), "--synthetic-data"],
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 2 and "cannot read plan file" in missing.stderr
