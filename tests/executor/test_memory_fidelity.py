"""Memory fidelity: the planner's memory prediction against torch's own accounting of real runs.

One torchrun launch (2 CPU ranks, gloo) runs every configuration of tests/executor/memory_configs.py
through the runtime's code path and measures (tests/executor/workers/memory_fidelity.py):
  - the sharded states, exactly: parameter, gradient and optimizer-state bytes per rank, which must
    match 4 / 4 / 8 bytes x parameters / shard group (fp32 AdamW; with tensor parallelism the rank's
    tp share of the parameters) and the plan's breakdown (2%);
  - the whole-step peak per rank, by the runtime's CPU method (persistent bytes + the torch
    profiler's peak net allocation, counting the tensors the training thread allocates), which
    must match `prediction.peak_memory_gib` within PEAK_TOLERANCE (the issue's CPU target). A plan
    that OOMs on the GPU is the worst defect this product can have, and this is the check CI can
    run without one. Each configuration is measured over several steps and the lowest counts:
    gloo runs collectives on worker threads, and when they fall behind (a loaded CPU) the buffers
    of collectives still in flight stay alive into the next peak, by up to ~20% here, which says
    more about the machine's load than about the plan. The planner prices communication that keeps
    up (one reduction buffer in flight); the highest step (all threads: exactly the runtime's
    MemoryMeter) is reported beside it as the in-flight high-water;
  - for eager FSDP2, torch's FSDPMemTracker over one more step: its peak must agree with the
    profiler's (the two measurements check each other) and splits the peak by category.

The per-configuration table (predicted, measured, error) is printed and is part of every failure.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from planner.cost.model_costs import model_costs, tensor_parallel_share
from planner.plan import Plan
from tests.executor.conftest import REPO, explain, job_env, torchrun
from tests.executor.memory_configs import CASES, MemoryCase, plan_documents

# One launch measures every case: 4.4 minutes on an idle 2-core AMD EPYC with AVX2 alone (its bf16 matrix
# products ~40x slower than fp32), up to twice that beside the rest of the suite; pytest's 10-minute
# default is too tight there.
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1500)]
LAUNCH_TIMEOUT_S = 1200

WORKER = str(REPO / "tests" / "executor" / "workers" / "memory_fidelity.py")
GIB = 1024.0**3
PEAK_TOLERANCE = 0.10
STATE_TOLERANCE = 0.02
TRACKER_TOLERANCE = 0.10
ADAMW_STATE_BYTES = {"params": 4, "grads": 4, "optimizer": 8}
"""Per parameter, fp32 (mixed precision); pure bf16 holds half of each."""


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """label -> {"case", "plan", "ranks": per-rank worker records}: one launch for all cases."""
    tmp = tmp_path_factory.mktemp("memory_fidelity")
    documents = plan_documents(CASES)
    plans_file, out = tmp / "plans.json", tmp / "measured.json"
    plans_file.write_text(json.dumps(documents))
    command = [WORKER, "--plans", str(plans_file), "--out", str(out)]
    result = torchrun(2, command, env=job_env(), timeout=LAUNCH_TIMEOUT_S)
    if result.returncode != 0 and "SIGABRT" in result.stderr:
        # About one launch in five on this 2-core VM, a rank aborts mid-run inside gloo/the profiler
        # (no Python traceback; see the closing notes of issue 11). Once is retried, loudly; twice fails.
        detail = explain(result, tail=2000)
        warnings.warn(f"memory-fidelity workers aborted; retrying once\n{detail}", stacklevel=1)
        result = torchrun(2, command, env=job_env(), timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, explain(result)
    measured = json.loads(out.read_text())
    runs = {
        case.label: {"case": case, "plan": Plan.model_validate(doc["plan"]), "ranks": ranks}
        for case, doc, ranks in zip(CASES, documents, measured, strict=True)
    }
    print("\n" + table(runs))
    return runs


def measured_peak_gib(run: dict[str, Any]) -> float:
    """The settled whole-step peak: the lowest measured step on each rank, the highest rank."""
    return max(min(rank["peaks_gib"]) for rank in run["ranks"])


def high_water_gib(run: dict[str, Any]) -> float:
    """The highest step on any rank, all threads (what the runtime's MemoryMeter reports)."""
    return max(max(rank["runtime_meter_peaks_gib"]) for rank in run["ranks"])


def table(runs: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| configuration | predicted GiB | measured GiB | error | high-water GiB | error | states |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, run in runs.items():
        predicted = run["plan"].prediction.peak_memory_gib
        measured = measured_peak_gib(run)
        high = high_water_gib(run)
        states = "ok" if not state_errors(run) else "OFF"
        flag = "" if abs(_error(predicted, measured)) <= PEAK_TOLERANCE else " **>10%**"
        lines.append(
            f"| {label} | {predicted:.4f} | {measured:.4f} | {_error(predicted, measured):+.1%}{flag} | "
            f"{high:.4f} | {_error(predicted, high):+.1%} | {states} |"
        )
    return "\n".join(lines)


def _rank_params(plan: Plan) -> int:
    """Parameters one rank of the plan's tensor-parallel group holds, as the planner prices them."""
    costs = model_costs(plan.model, plan.training.seq_len)
    return tensor_parallel_share(costs, plan.config.mesh.tp).rank_params


def state_errors(run: dict[str, Any]) -> list[str]:
    """Where the measured sharded states differ from the plan's (beyond STATE_TOLERANCE)."""
    plan: Plan = run["plan"]
    n = plan.model.num_params
    mesh = plan.config.mesh
    # With tp, each rank holds its tensor-parallel share (norm weights whole): the plan's count.
    share = _rank_params(plan)
    shard = mesh.dp_shard
    breakdown = plan.prediction.memory_breakdown_gib
    errors = []
    for rank in run["ranks"]:
        if rank["num_params"] != n:
            errors.append(f"rank {rank['rank']}: model has {rank['num_params']} parameters, plan {n}")
        element = 0.5 if run["case"].state_dtype == "bfloat16" else 1.0
        for term, per_param in ADAMW_STATE_BYTES.items():
            expected = per_param * element * share / shard
            got = rank[f"{'param' if term == 'params' else term.rstrip('s')}_bytes"]
            if abs(_error(expected, got)) > STATE_TOLERANCE:
                errors.append(f"rank {rank['rank']} {term}: measured {got} B, plan {expected:.0f} B")
        # The breakdown's states (present at any peak) are the same sizes.
        for term, got in (("params", rank["param_bytes"]), ("optimizer", rank["optimizer_bytes"])):
            priced = getattr(breakdown, term) * GIB
            if abs(_error(priced, got)) > STATE_TOLERANCE:
                errors.append(f"rank {rank['rank']} breakdown {term}: {priced:.0f} B, measured {got} B")
    return errors


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.label)
def test_sharded_states_match_the_plan(runs: dict[str, dict[str, Any]], case: MemoryCase) -> None:
    assert state_errors(runs[case.label]) == []


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.label)
def test_peak_memory_within_tolerance(runs: dict[str, dict[str, Any]], case: MemoryCase) -> None:
    run = runs[case.label]
    predicted = run["plan"].prediction.peak_memory_gib
    measured = measured_peak_gib(run)
    error = _error(predicted, measured)
    allowed = case.over_prediction_allowed if error > 0 and case.over_prediction_allowed else PEAK_TOLERANCE
    assert abs(error) <= allowed, (
        f"{case.label}: predicted {predicted:.4f} GiB, measured {measured:.4f} GiB "
        f"({_error(predicted, measured):+.1%}); breakdown {run['plan'].prediction.memory_breakdown_gib}; "
        f"FSDPMemTracker peak {run['ranks'][0]['mem_tracker']}\n{table(runs)}"
    )


def test_mem_tracker_agrees_with_the_profiler(runs: dict[str, dict[str, Any]]) -> None:
    """torch's FSDPMemTracker (eager FSDP2) confirms the profiler's settled whole-step peak.

    The tracker drops a tensor when Python releases it; the profiler when its memory is freed,
    which for a buffer a gloo collective still holds in C++ is later. So the tracker may read
    lower (by the buffers in flight), never higher.
    """
    checked = 0
    for label, run in runs.items():
        if run["case"].compile:
            continue
        for rank in run["ranks"]:
            assert rank["mem_tracker"] is not None, f"{label}: {rank['mem_tracker_error']}"
            tracked = rank["mem_tracker"]["Total"] / GIB
            settled = min(rank["peaks_gib"])
            ok = settled * (1 - TRACKER_TOLERANCE) <= tracked <= settled * 1.01
            assert ok, (label, tracked, rank["peaks_gib"])
            checked += 1
    assert checked >= 2 * 8


def test_configurations_span_the_space() -> None:
    """The issue's coverage: >= 10 configs across engines, checkpointing, micro-batches, loss chunks."""
    assert len(CASES) >= 10
    assert {c.compile for c in CASES} == {True, False}
    assert {c.sharding for c in CASES} == {"full_shard", "shard_grad_op", "no_shard"}
    assert {c.checkpointing for c in CASES} == {"none", "selective", "op_selective", "full", "blocks"}
    assert {c.state_dtype for c in CASES} == {"float32", "bfloat16"}
    assert {c.micro_batch for c in CASES} == {1, 2} and {c.grad_accum for c in CASES} == {1, 2}
    assert {c.loss_chunks > 1 for c in CASES} == {True, False}
