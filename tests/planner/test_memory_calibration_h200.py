"""Memory calibration on the project's own H200 runs (`bench/results/gpu_plans.json`): a calibrated
plan's peak must not move away from the measured one.

The runs' calibration profile is not in the repository; `bench/RESULTS.md` ("GPU plans benchmark")
records what it measured: llama3-8b cut to 8 blocks, seq 4096, micro-batch 2, one H200, five step
shapes of 1 / 1 / 4 / 4 / 1 blocks (eager full_shard and no_shard, then compiled full_shard, in the
profiler's order) with reserved peaks of 32.1 / 33.1 / 47.7 / 45.7 / 28.3 GiB, measured by
bench/gpu_plans.py's calibrate() under torch's default allocator (it set no PYTORCH_CUDA_ALLOC_CONF),
while the runs themselves ran through launch.sh with expandable segments. Its allocated peaks were not
kept: the profile below takes the memory model's, less SHORTFALL_GIB, the shortfall at which the
reserve fit as it was reproduces the recorded calibrated peaks of the compiled runs to the digit
(76.08 and 81.24 GiB: the reserve at its 50% bound); the fit as it was then also gives the other two
within about 2 GiB (mb2x2 73.8 against 74.5; eager 66.6 against 68.7, from an activation scale of 0.5
to 0.6 fitted on steps whose transient memory was mostly an unsliced 128k-vocabulary loss). The fixed
fit takes neither the reserve nor that scale.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from contract.parallel_config import CheckpointingConfig, ParallelConfig
from planner.calibration import CalibrationProfile, StepSample, sample_setting
from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import resolve_model
from planner.cost.estimate import Estimator
from planner.cost.memory import PRICED_ALLOCATOR_CONFIG
from planner.cost.parameters import GIB, default_parameters
from planner.search import make_plan, predict
from planner.specs import ClusterSpec, PlanRequest, TrainingSpec

RECORDS = Path(__file__).resolve().parents[2] / "bench" / "results" / "gpu_plans.json"
REQUEST_NAME = "llama3-8b-8l-s4096-b4"
SHORTFALL_GIB = 2.5
"""How far the profile's allocated peaks lay below the memory model's (its unsliced loss priced at 6
bytes per token and vocabulary entry; see the module docstring)."""
PROFILE_SHAPES = (  # (sharding, blocks, compiled, reserved GiB) as bench/RESULTS.md lists them
    ("full_shard", 1, False, 32.1),
    ("no_shard", 1, False, 33.1),
    ("no_shard", 4, False, 47.7),
    ("full_shard", 4, False, 45.7),
    ("full_shard", 1, True, 28.3),
)


def _request() -> PlanRequest:
    model = resolve_model("llama3-8b")
    model = model.model_copy(update={"name": "llama3-8b-8l", "num_layers": 8})
    return PlanRequest(
        model=model,
        cluster=ClusterSpec.parse("1x1xH200"),
        training=TrainingSpec(seq_len=4096, global_batch_tokens=4 * 4096, precision="bf16"),
    )


def _profile(allocator_config: str | None) -> CalibrationProfile:
    request = _request()
    skeleton = CalibrationProfile.model_validate(
        {
            "gpu": "H200",
            "fingerprint": {
                "device_name": "NVIDIA H200",
                "device_count": 1,
                "backend": "nccl",
                "torch_version": "2.11.0+cu130",
            },
            "model": request.model.model_dump(),
            "allocator_config": allocator_config,
        }
    )
    base = default_parameters(resolve_gpu("H200"), request.cluster, "bf16")
    allocated_only = base.with_changes(allocator_reserve=0.0)
    steps = []
    for sharding, blocks, compiled, reserved_gib in PROFILE_SHAPES:
        sample = StepSample(
            num_layers=blocks, micro_batch_size=2, seq_len=4096, ranks=1, sharding=sharding,
            dtype="bfloat16", compile=compiled, seconds=1.0, update_seconds=0.1,
        )  # fmt: skip
        setting, choice = sample_setting(skeleton, sample, allocated_only, "bf16")
        allocated = int(Estimator(setting).memory(choice).total - SHORTFALL_GIB * GIB)
        reserved = int(reserved_gib * GIB)
        assert reserved > allocated  # the reserved peaks hold several GiB beyond the tensors
        steps.append(
            sample.model_copy(update={"peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved})
        )
    return skeleton.model_copy(update={"steps": steps})


def _config(pick: ParallelConfig, label: str) -> ParallelConfig:
    """The configuration a record names (labels of that commit: no mesh in them)."""
    config = replace(pick, compile=label.endswith("compiled"))
    if "mb2x2" in label:
        config = replace(config, micro_batch_size=2, grad_accum_steps=2)
    if "AC=sel4" in label:
        config = replace(config, checkpointing=CheckpointingConfig(mode="selective", every_k=4))
    assert config.label().replace(" dp1x1 tp1", "") == label
    return config


def _records() -> list[dict]:
    runs = json.loads(RECORDS.read_text())["runs"]
    return [r for r in runs if r["request"] == REQUEST_NAME and r["calibrated"] and not r["oom"]]


def test_the_records_show_the_failure_the_fit_must_not_repeat() -> None:
    pick = next(r for r in _records() if r["picked"])
    assert pick["predicted_peak_gib"] == pytest.approx(76.08, abs=0.01)
    assert pick["measured_peak_gib"] == pytest.approx(65.26, abs=0.01)
    request = _request()
    uncalibrated = make_plan(request)
    assert uncalibrated.prediction.peak_memory_gib == pytest.approx(62.70, abs=0.05)
    # The old rule (the reserve fitted from every profile's reserved peaks, as if they were the
    # launchers' allocator's) on this profile gives what the runs recorded, away from what they measured.
    as_recorded = _profile(PRICED_ALLOCATOR_CONFIG)
    for record in _records():
        if record["config"].endswith("compiled") and "mb4x1" in record["config"]:
            config = _config(uncalibrated.config, record["config"])
            old_rule = predict(request, config, calibration=as_recorded).prediction.peak_memory_gib
            assert old_rule == pytest.approx(record["predicted_peak_gib"], abs=0.05), record["config"]


@pytest.mark.parametrize("allocator_config", [None, ""])
def test_a_calibrated_peak_does_not_move_away_from_the_measured_one(allocator_config: str | None) -> None:
    # Memory only: the profile's step times are placeholders, so configurations are priced as the
    # records name them (the uncalibrated pick is the recorded one), not searched with the profile.
    request = _request()
    profile = _profile(allocator_config)
    pick = make_plan(request)
    records = _records()
    assert pick.config.label().replace(" dp1x1 tp1", "") in {r["config"] for r in records if r["picked"]}
    for record in records:
        config = _config(pick.config, record["config"])
        measured = record["measured_peak_gib"]
        calibrated = predict(request, config, calibration=profile).prediction.peak_memory_gib
        uncalibrated = predict(request, config).prediction.peak_memory_gib
        assert abs(calibrated - measured) <= abs(uncalibrated - measured) + 0.01, record["config"]
        if record["picked"]:  # 76.1 recorded against 65.3 measured: now within the uncalibrated 4%
            assert abs(calibrated - measured) / measured < 0.05
        priced = predict(request, config, calibration=profile).prediction
        assert "uncalibrated allocator reserve (5% of transient memory) stays" in priced.memory_margin_reason
        assert priced.memory_margin == 0.16  # its reserved peaks cannot narrow the margin
