"""Out of memory in the trainer: a real allocation failure in backward on one rank of a torchrun job
is recorded (metrics file + stderr) and ends the job with the documented exit status."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from executor.runtime.oom import EXIT_OOM, PhaseTracker, find_oom, oom_record, requested_bytes
from executor.runtime.train import parse_args
from tests.executor.conftest import REPO, explain, job_env, read_metrics, torchrun
from tests.executor.plan_factory import debug_plan

FACTORY = "tests.executor.workers.oom_model:build"


def test_requested_bytes_from_cuda_and_cpu_messages() -> None:
    cuda = "CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 has a total capacity of 79.19 GiB"
    assert requested_bytes(cuda) == round(7.83 * 1024**3)
    assert requested_bytes("Tried to allocate 20.00 MiB (GPU 0; ...)") == 20 * 1024**2
    cpu = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes. Error code 12"
    assert requested_bytes(cpu) == 1024
    assert requested_bytes("something else") is None


def test_a_real_cpu_allocation_failure_is_recognised_even_when_wrapped() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**48, dtype=torch.uint8)
    assert find_oom(info.value) is info.value
    try:
        try:
            torch.empty(2**48, dtype=torch.uint8)
        except RuntimeError as exc:
            raise ValueError("wrapped by a library") from exc
    except ValueError as wrapped:
        assert find_oom(wrapped) is wrapped.__cause__
    assert find_oom(RuntimeError("shapes do not match")) is None
    assert find_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) is not None

    tracker = PhaseTracker()
    tracker.enter("backward", 7)
    record = oom_record(info.value, tracker)
    assert (record.step, record.phase, record.event) == (7, "backward", "oom")
    assert record.requested_bytes == 2**48 and record.allocated_bytes is None
    assert "at step 7 (backward)" in record.describe() and "262144.00 GiB" in record.describe()


def test_exit_status_is_documented_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert f"{EXIT_OOM} out of memory" in " ".join(capsys.readouterr().out.split())


def test_max_memory_gib_is_refused_on_cpu(write_plan) -> None:
    plan = write_plan(debug_plan(gpus_per_node=1))
    result = subprocess.run(
        [sys.executable, "-m", "executor.runtime.train", "--plan", str(plan), "--device", "cpu",
         "--max-memory-gib", "1", "--synthetic-data"],
        cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--max-memory-gib caps CUDA memory" in result.stderr


@pytest.mark.distributed
def test_oom_in_backward_is_recorded_and_exits_with_the_oom_status(write_plan, tmp_path) -> None:
    plan = write_plan(debug_plan(sharding="full_shard", micro_batch_size=1))
    metrics = tmp_path / "metrics.jsonl"
    # Rank 1 fails in step 2's backward: rank 0 wrote step 1, rank 1 writes its own OOM line.
    result = torchrun(
        2,
        ["-m", "executor.runtime.train", "--plan", str(plan), "--steps", "4", "--metrics-file", str(metrics),
         "--model-factory", FACTORY, "--synthetic-data"],
        env=job_env(OOM_RANK="1", OOM_STEP="2"),
        timeout=180,
    )
    assert result.returncode != 0, explain(result)
    # torchrun exits 1 for any failed worker; the worker's own status is in its failure summary.
    assert f"exitcode  : {EXIT_OOM}" in result.stderr, explain(result)
    assert "error: OUT OF MEMORY on rank 1 (cpu) at step 2 (backward); tried to allocate" in result.stderr
    assert "Traceback" not in result.stderr.split("error: OUT OF MEMORY")[0]
    records = read_metrics(metrics)
    ooms = [r for r in records if r.get("event") == "oom"]
    assert len(ooms) == 1, records
    oom = ooms[0]
    assert (oom["step"], oom["phase"], oom["rank"], oom["device"]) == (2, "backward", 1, "cpu")
    assert oom["requested_bytes"] == 2**48 and oom["plan_hash"] == "0" * 64
    assert "can't allocate memory" in oom["message"]
    assert [r["step"] for r in records if "event" not in r] == [1]


def test_single_process_oom_exits_with_the_oom_status(write_plan, tmp_path) -> None:
    plan = write_plan(debug_plan(gpus_per_node=1, micro_batch_size=1))
    metrics = tmp_path / "metrics.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "executor.runtime.train", "--plan", str(plan), "--steps", "3",
         "--metrics-file", str(metrics), "--model-factory", FACTORY, "--synthetic-data"],
        cwd=REPO, env=job_env(OOM_STEP="1"), capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == EXIT_OOM, explain(result)
    assert "Traceback" not in result.stderr
    (oom,) = read_metrics(metrics)
    assert (oom["event"], oom["step"], oom["phase"]) == ("oom", 1, "backward")
