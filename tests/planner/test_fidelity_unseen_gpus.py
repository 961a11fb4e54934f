"""The report's view of the GPU types no fit run measured: every priced run on them, dense and
mixture-of-experts, summarised per type and held to the new-hardware targets (8 runs, 2 sources, 15%)."""

from __future__ import annotations

import pytest

from contract.mesh import Mesh
from planner.fidelity.report import (
    UNSEEN_GPU_MIN_RUNS,
    RunResult,
    _unseen_gpu_targets,
    stored_report,
    unseen_gpus,
)
from planner.specs import ClusterSpec
from planner.uncertainty import coverage_warnings, interval_data


def _run(
    source: str, gpu: str, error: float | None, *, split: str = "held-out", moe: bool = False
) -> RunResult:
    return RunResult(
        source=source, run_id=f"{gpu}-{error}", split=split, gpu=gpu, engine="torchtitan", trainer="t",  # type: ignore[arg-type]
        config="c", priced=True, throughput_error=error, moe=moe,
    )


def test_a_gpu_type_is_unseen_until_a_fit_run_measures_its_throughput() -> None:
    results = [
        _run("fit-a", "H100", 0.05, split="fit"),
        _run("fit-b", "B200", None, split="fit"),  # a power-capped run: memory only
        _run("held", "H100", 0.2),
        _run("held", "B200", -0.1),
        _run("held", "GB200", 0.3, moe=True),
    ]
    assert unseen_gpus(results) == {"B200", "GB200"}


def test_the_targets_count_runs_and_sources_and_hold_the_mean() -> None:
    few = [_run("s1", "GB200", 0.1), _run("s1", "GB300", -0.1, moe=True)]
    count, mean = _unseen_gpu_targets(few)
    assert count.value == "2 (1)" and not count.met
    assert mean.value == "10.0%" and mean.met
    many = [_run(f"s{i % 2}", "MI300X", 0.2) for i in range(UNSEEN_GPU_MIN_RUNS)]
    count, mean = _unseen_gpu_targets(many)
    assert count.met and not mean.met and mean.value == "20.0%"
    assert _unseen_gpu_targets([_run("fit", "H100", 0.1, split="fit")]) == []


def test_the_stored_report_summarises_them_per_type_and_together() -> None:
    report = stored_report()
    unseen = unseen_gpus(report.runs)
    groups = {s.group for s in report.unseen_gpu_by_gpu}
    measured = {r.gpu for r in report.runs if r.gpu in unseen and r.throughput_error is not None}
    assert groups == measured | {"all"}
    (total,) = [s for s in report.unseen_gpu_by_gpu if s.group == "all"]
    (target,) = [t for t in report.targets if t.name.startswith("GPU types no fit run measured: throughput")]
    assert target.value == f"{total.mean_abs:.1%}"
    assert total.runs == pytest.approx(sum(s.runs for s in report.unseen_gpu_by_gpu if s.group != "all"))


def test_a_gpu_type_only_mixture_of_experts_runs_measured_is_in_the_corpus_reach() -> None:
    # GB200 has no dense published run the planner prices, only Megatron's gpt-oss-120b rows: a plan on
    # it is not told that no priced run ran there, and the advice names the command that calibrates.
    report = stored_report()
    assert any(r.gpu == "GB200" and r.moe and r.priced for r in report.runs)
    assert not any(r.gpu == "GB200" and not r.moe and r.priced for r in report.runs)
    assert "GB200" in interval_data()["reach"]["gpus"]
    codes = [c.code for c in coverage_warnings(cluster=ClusterSpec.parse("1x4xGB200"), mesh=Mesh(dp_shard=4))]
    assert "gpu_outside_corpus" not in codes
    (outside,) = coverage_warnings(cluster=ClusterSpec.parse("1x8xL4"), mesh=Mesh(dp_shard=8))
    assert "`fsdp-planner calibrate`" in outside.message
