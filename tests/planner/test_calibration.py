"""Fitting cost parameters from a CalibrationProfile, and using it in a plan."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from pydantic import ValidationError

from planner.calibration import (
    CalibrationProfile,
    StepSample,
    fit_parameters,
    predicted_step_time,
    sample_setting,
)
from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import resolve_model
from planner.cost.estimate import Estimator
from planner.cost.gemm import tile_efficiency
from planner.cost.memory import PRICED_ALLOCATOR_CONFIG, runs_priced_allocator
from planner.cost.model_costs import model_costs
from planner.cost.parameters import default_parameters
from planner.search import make_plan, predict
from planner.specs import ClusterSpec
from tests.planner.conftest import make_request

FINGERPRINT = {
    "device_name": "NVIDIA H100 80GB HBM3",
    "device_count": 8,
    "gpus_per_node": 8,
    "backend": "nccl",
    "torch_version": "2.13.0",
}


def synthetic_profile(*, efficiency: float, overhead: float, latency: float, bandwidth: float) -> dict:
    peak = 989.4e12
    sizes = [512, 1024, 2048, 4096, 8192]
    matmul = [
        {"m": s, "n": s, "k": s, "dtype": "bfloat16", "seconds": 2 * s**3 / (peak * efficiency) + overhead}
        for s in sizes
    ]
    collectives = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        factor = 2 if op == "all_reduce" else 1
        for nbytes in (1 << 20, 1 << 24, 1 << 28, 1 << 30):
            seconds = factor * (latency + nbytes * 7 / 8 / bandwidth)
            collectives.append(
                {"op": op, "group_size": 8, "link": "intra", "bytes": nbytes, "seconds": seconds}
            )
    return {
        "name": "synthetic",
        "gpu": "H100-SXM-80GB",
        "fingerprint": dict(FINGERPRINT),
        "matmul": matmul,
        "collectives": collectives,
    }


def test_fitting_recovers_known_parameters() -> None:
    profile = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.42, overhead=15e-6, latency=30e-6, bandwidth=200e9)
    )
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")
    fitted = fit_parameters(profile, base=base, precision="bf16")
    # The ceiling is the GEMM curve's (planner/cost/gemm.py): at the largest GEMM timed, the curve's
    # shape times it is the 0.42 measured (tests/planner/test_gemm_curve.py tests the curve).
    largest = tile_efficiency(8192, 8192, 8192, base.sm_count)
    assert fitted.matmul_efficiency * largest == pytest.approx(0.42, rel=1e-2)
    assert fitted.matmul_overhead_s == pytest.approx(15e-6, rel=1e-3)
    assert fitted.links["intra"].bandwidth == pytest.approx(200e9, rel=1e-3)
    assert fitted.links["intra"].latency(8) == pytest.approx(30e-6, rel=1e-3)
    assert fitted.links["inter"] == base.links["inter"]  # not measured: default kept


def test_timed_float8_gemms_set_the_tensorwise_efficiency_the_plan_prices_with() -> None:
    document = synthetic_profile(efficiency=0.5, overhead=10e-6, latency=30e-6, bandwidth=200e9)
    fp8_peak = 1978.9e12
    # Float8 GEMMs at 0.8 of the float8 peak where bf16 reaches 0.5 of its own: 1.6x the 2x allowed.
    document["matmul"] += [
        {"m": s, "n": s, "k": s, "dtype": "float8_e4m3fn", "seconds": 2 * s**3 / (fp8_peak * 0.8) + 10e-6}
        for s in (1024, 2048, 4096, 8192)
    ]
    profile = CalibrationProfile.model_validate(document)
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")
    fitted = fit_parameters(profile, base=base, precision="bf16")
    assert fitted.float8_gemm_efficiency["tensorwise"] == 1.0  # 1.6 measured, bounded by the peaks' 2x
    slower = [dict(m, seconds=m["seconds"] * 2) if m["dtype"] == "float8_e4m3fn" else m
              for m in document["matmul"]]
    halved = fit_parameters(CalibrationProfile.model_validate({**document, "matmul": slower}), base=base,
                            precision="bf16")
    assert halved.float8_gemm_efficiency["tensorwise"] == pytest.approx(0.8, rel=2e-3)
    assert halved.float8_gemm_efficiency["rowwise"] == base.float8_gemm_efficiency["rowwise"]  # not timed
    # Without float8 samples the corpus's ratio stays.
    plain = fit_parameters(CalibrationProfile.model_validate(synthetic_profile(
        efficiency=0.5, overhead=10e-6, latency=30e-6, bandwidth=200e9)), base=base, precision="bf16")
    assert plain.float8_gemm_efficiency == base.float8_gemm_efficiency


def test_a_slow_measured_machine_changes_the_plan_where_it_should() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=32)
    default = make_plan(request)
    slow_links = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.5, overhead=8e-6, latency=50e-6, bandwidth=5e9)
    )
    calibrated = make_plan(request, calibration=slow_links, calibration_id="slow-nvlink")
    assert calibrated.calibration_id == "slow-nvlink"
    assert calibrated.plan_hash != default.plan_hash
    # With 5 GB/s links the same step spends far longer in communication ...
    assert calibrated.prediction.comm_s > 10 * default.prediction.comm_s
    assert calibrated.prediction.tokens_per_s_per_gpu < default.prediction.tokens_per_s_per_gpu


@pytest.mark.parametrize(
    "mutation",
    [
        lambda p: p["matmul"][0].update(seconds=-1.0),
        lambda p: p["collectives"][0].update(group_size=1),
        lambda p: p["fingerprint"].update(backend="carrier-pigeon"),
        lambda p: p.update(unexpected=True),
        lambda p: p["matmul"][0].update(seconds=float("nan")),
        lambda p: p.update(
            steps=[
                {
                    "num_layers": 0,
                    "micro_batch_size": 1,
                    "seq_len": 8,
                    "ranks": 2,
                    "seconds": 1.0,
                    "update_seconds": 0.1,
                }
            ]
        ),
        lambda p: p.update(
            steps=[
                {
                    "num_layers": 1,
                    "micro_batch_size": 1,
                    "seq_len": 8,
                    "ranks": 2,
                    "seconds": 1.0,
                    "update_seconds": -0.1,
                }
            ]
        ),
    ],
)
def test_malformed_profiles_are_refused(mutation) -> None:
    profile = synthetic_profile(efficiency=0.5, overhead=1e-5, latency=1e-5, bandwidth=1e11)
    mutation(profile)
    with pytest.raises(ValidationError):
        CalibrationProfile.model_validate(profile)


def test_a_calibrated_plan_never_shares_the_uncalibrated_hash() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=32)
    profile = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.5, overhead=8e-6, latency=20e-6, bandwidth=3e11)
    )
    calibrated = make_plan(request, calibration=profile)
    assert calibrated.calibration_id == profile.content_id()
    assert calibrated.plan_hash != make_plan(request).plan_hash
    assert make_plan(request, calibration=profile).plan_hash == calibrated.plan_hash


def cpu_profile_with_steps(truth, shapes) -> CalibrationProfile:
    """A CPU profile of llama-debug whose timed steps are what `truth` parameters predict."""
    skeleton = CalibrationProfile.model_validate(
        {
            "gpu": "cpu",
            "fingerprint": {
                "device_name": "cpu",
                "device_count": 2,
                "gpus_per_node": 2,
                "backend": "gloo",
                "torch_version": "2.13.0",
            },
            "model": resolve_model("llama-debug").model_dump(),
        }
    )
    steps = []
    for layers, accum, *rest in shapes:
        # (layers, accumulation[, sharding[, other StepSample fields]])
        sample = StepSample(
            num_layers=layers,
            micro_batch_size=2,
            grad_accum_steps=accum,
            seq_len=128,
            ranks=2,
            sharding=rest[0] if rest else "full_shard",
            seconds=1.0,
            update_seconds=1.0,
            **(rest[1] if len(rest) > 1 else {}),
        )
        shard = 2 if sample.sharding == "full_shard" else 1
        local_params = (
            model_costs(skeleton.model.model_copy(update={"num_layers": layers}), 128).num_params / shard
        )
        steps.append(
            sample.model_copy(
                update={
                    "seconds": predicted_step_time(skeleton, sample, truth, "fp32"),
                    "update_seconds": truth.optimizer_overhead_s
                    + local_params * truth.optimizer_bytes_per_param / truth.memory_bandwidth,
                }
            )
        )
    return skeleton.model_copy(update={"steps": steps})


def test_fitting_recovers_optimizer_scale_and_overhead_from_timed_steps() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    truth = base.with_changes(
        compute_scale=1.35,
        micro_batch_overhead_s=0.02,
        optimizer_overhead_s=0.004,
        optimizer_bytes_per_param=150.0,
    )
    profile = cpu_profile_with_steps(truth, [(1, 1), (2, 1), (1, 2), (4, 1)])
    fitted = fit_parameters(profile, base=base, precision="fp32")
    assert fitted.compute_scale == pytest.approx(1.35, rel=0.01)
    assert fitted.micro_batch_overhead_s == pytest.approx(0.02, rel=0.02)
    assert fitted.optimizer_overhead_s == pytest.approx(0.004, rel=1e-3)
    assert fitted.optimizer_bytes_per_param == pytest.approx(150.0, rel=1e-3)
    # The fitted model reproduces every timed step, including the depth it never saw.
    deeper = cpu_profile_with_steps(truth, [(8, 2)]).steps[0]
    assert predicted_step_time(profile, deeper, fitted, "fp32") == pytest.approx(deeper.seconds, rel=0.01)


def test_replicated_and_sharded_steps_separate_the_sharding_overhead() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    truth = base.with_changes(compute_scale=1.35, micro_batch_overhead_s=0.02, sharding_overhead_s=0.03)
    shapes = [(1, 1), (1, 1, "no_shard"), (2, 1, "no_shard"), (2, 1), (1, 2), (4, 1)]
    fitted = fit_parameters(cpu_profile_with_steps(truth, shapes), base=base, precision="fp32")
    assert fitted.compute_scale == pytest.approx(1.35, rel=0.01)
    assert fitted.micro_batch_overhead_s == pytest.approx(0.02, rel=0.02)
    assert fitted.sharding_overhead_s == pytest.approx(0.03, rel=0.02)


def test_steps_at_one_depth_fit_the_overhead_and_keep_the_scale() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    truth = base.with_changes(micro_batch_overhead_s=0.05)
    fitted = fit_parameters(cpu_profile_with_steps(truth, [(1, 1), (1, 2)]), base=base, precision="fp32")
    assert fitted.compute_scale == base.compute_scale
    assert fitted.micro_batch_overhead_s == pytest.approx(0.05, rel=0.01)


def test_a_faster_than_predicted_step_never_gives_negative_overhead() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    profile = cpu_profile_with_steps(base, [(1, 1)])
    fast = profile.model_copy(
        update={"steps": [profile.steps[0].model_copy(update={"seconds": profile.steps[0].seconds / 3})]}
    )
    assert fit_parameters(fast, base=base, precision="fp32").micro_batch_overhead_s == 0.0


def test_timed_steps_of_another_optimizer_are_not_used() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    profile = cpu_profile_with_steps(base.with_changes(micro_batch_overhead_s=0.05), [(1, 1)])
    fitted = fit_parameters(profile, base=base, precision="fp32", optimizer="sgd")
    assert fitted.micro_batch_overhead_s == 0.0
    assert fitted.optimizer_bytes_per_param == base.optimizer_bytes_per_param


EAGER_SHAPES = [(1, 1), (1, 1, "no_shard"), (2, 1, "no_shard"), (2, 1), (1, 2), (4, 1)]
COMPILED = {"compile": True}


def test_compiled_steps_fit_the_compiled_compute_scale_after_the_eager_fit() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    truth = base.with_changes(
        compute_scale=1.35, micro_batch_overhead_s=0.02, sharding_overhead_s=0.03, compiled_compute_scale=0.8
    )
    shapes = [
        *EAGER_SHAPES,
        (2, 1, "full_shard", {"checkpointing": "full"}),
        (1, 1, "full_shard", COMPILED),
        (1, 1, "no_shard", COMPILED),
    ]
    profile = cpu_profile_with_steps(truth, shapes)
    fitted = fit_parameters(profile, base=base, precision="fp32")
    assert fitted.compiled_compute_scale == pytest.approx(0.8, rel=0.01)
    # The eager fit is what eager steps alone give: compiled and checkpointed steps do not bend it.
    assert fitted.compute_scale == pytest.approx(1.35, rel=0.01)
    assert fitted.micro_batch_overhead_s == pytest.approx(0.02, rel=0.02)
    assert fitted.sharding_overhead_s == pytest.approx(0.03, rel=0.02)
    # A compiled depth it never saw is priced right; eager prices are untouched by the new scale.
    deeper = cpu_profile_with_steps(truth, [(4, 1, "full_shard", COMPILED), (4, 1)]).steps
    for sample in deeper:
        assert predicted_step_time(profile, sample, fitted, "fp32") == pytest.approx(sample.seconds, rel=0.02)


def test_compiled_steps_do_not_pay_the_eager_hooks_overhead() -> None:
    # On CPU, FSDP2's hooks cost eager steps far more than one compiled graph's launch: compiled steps
    # are faster for that reason, not because their compute is 5x cheaper. With compiled steps at one
    # depth the fit cannot tell a scale from an overhead, and must not invent an implausible scale.
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    truth = base.with_changes(compute_scale=1.2, micro_batch_overhead_s=0.15, compiled_overhead_s=0.01)
    shapes = [*EAGER_SHAPES, (1, 1, "full_shard", COMPILED), (1, 1, "no_shard", COMPILED)]
    fitted = fit_parameters(cpu_profile_with_steps(truth, shapes), base=base, precision="fp32")
    assert fitted.compiled_compute_scale == pytest.approx(1.0, abs=0.02)
    assert fitted.compiled_overhead_s == pytest.approx(0.01, rel=0.1)
    assert fitted.micro_batch_overhead_s == pytest.approx(0.15, rel=0.02)


def test_without_compiled_steps_the_compiled_scale_stays_neutral() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    truth = base.with_changes(compute_scale=1.2, compiled_compute_scale=0.5)
    fitted = fit_parameters(cpu_profile_with_steps(truth, EAGER_SHAPES), base=base, precision="fp32")
    assert fitted.compiled_compute_scale == 1.0


def test_a_step_is_priced_with_its_own_engine_and_checkpointing() -> None:
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    profile = cpu_profile_with_steps(base, [(2, 1)])
    eager = profile.steps[0]
    full = eager.model_copy(update={"checkpointing": "full"})
    compiled = eager.model_copy(update={"compile": True})
    price = lambda s, p=base: predicted_step_time(profile, s, p, "fp32")  # noqa: E731
    assert price(full) > price(eager)  # recomputation
    assert price(compiled) != price(eager)
    slower = base.with_changes(compiled_compute_scale=2.0)
    assert price(compiled, slower) > price(compiled) and price(eager, slower) == price(eager)


OLD_STEP = {
    "num_layers": 1,
    "micro_batch_size": 1,
    "seq_len": 8,
    "ranks": 2,
    "seconds": 1.0,
    "update_seconds": 0.1,
}


def test_profiles_written_before_memory_and_compiled_steps_still_parse() -> None:
    profile = synthetic_profile(efficiency=0.5, overhead=1e-5, latency=1e-5, bandwidth=1e11)
    parsed = CalibrationProfile.model_validate({**profile, "steps": [OLD_STEP]})
    step = parsed.steps[0]
    assert (step.compile, step.checkpointing, step.loss_chunks) == (False, "none", 1)
    assert step.peak_allocated_bytes is None and step.memory_source is None
    assert parsed.usable_memory_bytes is None and parsed.device_memory_bytes is None


def test_memory_measurements_round_trip_through_json() -> None:
    profile = synthetic_profile(efficiency=0.5, overhead=1e-5, latency=1e-5, bandwidth=1e11)
    step = {
        **OLD_STEP,
        "compile": True,
        "checkpointing": "full",
        "loss_chunks": 4,
        "peak_allocated_bytes": 60 << 30,
        "peak_reserved_bytes": 64 << 30,
        "state_bytes": 20 << 30,
        "memory_source": "cuda",
    }
    document = {**profile, "steps": [step], "usable_memory_bytes": 79 << 30, "device_memory_bytes": 80 << 30}
    parsed = CalibrationProfile.model_validate(document)
    assert CalibrationProfile.model_validate_json(parsed.model_dump_json()) == parsed
    assert parsed.steps[0].peak_reserved_bytes == 64 << 30 and parsed.usable_memory_bytes == 79 << 30


@pytest.mark.parametrize(
    ("step", "profile_fields"),
    [
        ({"peak_allocated_bytes": 1e200}, {}),
        ({"peak_allocated_bytes": -1}, {}),
        ({"peak_reserved_bytes": 2 << 50}, {}),
        ({"state_bytes": -5}, {}),
        ({"peak_allocated_bytes": 10, "peak_reserved_bytes": 5}, {}),
        ({"memory_source": "guess"}, {}),
        ({"loss_chunks": 0}, {}),
        ({"checkpointing": "some"}, {}),
        ({}, {"usable_memory_bytes": 1e200}),
        ({}, {"usable_memory_bytes": -1}),
        ({}, {"device_memory_bytes": float("inf")}),
        ({}, {"usable_memory_bytes": 81 << 30, "device_memory_bytes": 80 << 30}),
    ],
)
def test_memory_fields_are_bounded(step: dict, profile_fields: dict) -> None:
    profile = synthetic_profile(efficiency=0.5, overhead=1e-5, latency=1e-5, bandwidth=1e11)
    with pytest.raises(ValidationError):
        CalibrationProfile.model_validate({**profile, "steps": [{**OLD_STEP, **step}], **profile_fields})


def gpu_profile_with_memory(
    truth,
    shapes,
    *,
    usable: int | None,
    device: int | None,
    allocator_config: str | None = PRICED_ALLOCATOR_CONFIG,
) -> CalibrationProfile:
    """An H100 profile of llama-debug whose step peaks are what `truth` parameters predict
    (allocated: without the allocator's reserve; reserved: with it), measured under the launchers'
    allocator unless `allocator_config` says otherwise."""
    skeleton = CalibrationProfile.model_validate(
        {
            "gpu": "H100",
            "fingerprint": {
                "device_name": "NVIDIA H100 80GB HBM3",
                "device_count": 1,
                "backend": "nccl",
                "torch_version": "2.11.0",
            },
            "model": resolve_model("llama-debug").model_dump(),
            "usable_memory_bytes": usable,
            "device_memory_bytes": device,
            "allocator_config": allocator_config,
        }
    )
    allocated_only = truth.with_changes(allocator_reserve=0.0)
    steps = []
    for layers, micro_batch, extra in shapes:
        sample = StepSample(
            num_layers=layers, micro_batch_size=micro_batch, seq_len=512, ranks=1, sharding="no_shard",
            dtype="bfloat16", seconds=1.0, update_seconds=0.1, **extra,
        )  # fmt: skip
        setting, choice = sample_setting(skeleton, sample, truth, "bf16")
        allocated, reserved = (
            int(Estimator(replace(setting, params=params)).memory(choice).total)
            for params in (allocated_only, truth)
        )
        steps.append(
            sample.model_copy(update={"peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved})
        )
    return skeleton.model_copy(update={"steps": steps})


MEMORY_SHAPES = [
    (1, 4, {}),
    (2, 4, {}),
    (2, 4, {"checkpointing": "full"}),
    (1, 4, COMPILED),
    (2, 2, COMPILED),
]


def test_memory_fit_recovers_engine_activations_reserve_and_usable_memory() -> None:
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x1xH100"), "bf16")
    truth = base.with_changes(
        activation_memory_scale=0.9, compiled_activation_memory_scale=1.25, allocator_reserve=0.08
    )
    gib = 1024**3
    profile = gpu_profile_with_memory(truth, MEMORY_SHAPES, usable=int(77.9 * gib), device=int(79.2 * gib))
    fitted = fit_parameters(profile, base=base, precision="bf16")
    assert fitted.activation_memory_scale == pytest.approx(0.9, rel=0.01)
    assert fitted.compiled_activation_memory_scale == pytest.approx(1.25, rel=0.01)
    assert fitted.allocator_reserve == pytest.approx(0.08, rel=0.02)
    assert fitted.usable_memory_gib == pytest.approx(77.9, rel=1e-6)
    # The fitted model reproduces every measured peak: the margin falls to its floor, and says so.
    assert fitted.memory_margin == pytest.approx(0.03)
    assert "calibrated" in fitted.memory_margin_reason and "5 measured steps" in fitted.memory_margin_reason


def test_a_calibrated_plan_takes_its_memory_and_margin_from_the_fit() -> None:
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x1xH100"), "bf16")
    truth = base.with_changes(compiled_activation_memory_scale=1.4, allocator_reserve=0.1)
    gib = 1024**3
    profile = gpu_profile_with_memory(truth, MEMORY_SHAPES, usable=int(78 * gib), device=int(79.2 * gib))
    request = make_request("llama-debug", "1x1xH100", seq_len=512, sequences=4)
    config = replace(make_plan(request).config, compile=True)
    uncalibrated = predict(request, config).prediction
    calibrated = predict(request, config, calibration=profile).prediction
    assert calibrated.peak_memory_gib > uncalibrated.peak_memory_gib  # compiled keeps more than priced
    assert calibrated.memory_margin < uncalibrated.memory_margin
    assert calibrated.usable_memory_gib == pytest.approx(78.0)
    assert calibrated.memory_margin_reason.startswith("calibrated")


def test_memory_samples_the_model_misses_widen_the_margin() -> None:
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x1xH100"), "bf16")
    profile = gpu_profile_with_memory(base, MEMORY_SHAPES, usable=None, device=None)
    # One step measured 10% above anything the fitted scales can explain (the optimizer step, say).
    steps = list(profile.steps)
    first = steps[0]
    steps[0] = first.model_copy(
        update={
            "peak_allocated_bytes": int(first.peak_allocated_bytes * 1.1),
            "peak_reserved_bytes": int(first.peak_reserved_bytes * 1.1),
        }
    )
    fitted = fit_parameters(profile.model_copy(update={"steps": steps}), base=base, precision="bf16")
    assert 0.05 < fitted.memory_margin < 0.2
    assert fitted.usable_memory_gib == base.usable_memory_gib  # nothing measured: the catalog's


def test_too_few_memory_samples_keep_the_uncalibrated_margin() -> None:
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x1xH100"), "bf16")
    profile = gpu_profile_with_memory(base, MEMORY_SHAPES[:2], usable=None, device=None)
    fitted = fit_parameters(profile, base=base, precision="bf16")
    assert fitted.memory_margin == base.memory_margin
    assert "cannot check the fit" in fitted.memory_margin_reason


def test_deeper_steps_timed_no_slower_leave_the_block_scale() -> None:
    # Seen on a loaded CPU: the 2-block replicated step timed faster than the 1-block one. A depth fit
    # would then drive the compute scale to the bottom of its range and price every deeper model at a
    # fraction of its cost; the blocks' own scale stands instead.
    base = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")
    profile = cpu_profile_with_steps(base.with_changes(micro_batch_overhead_s=0.1), EAGER_SHAPES)
    steps = [
        s.model_copy(update={"seconds": 0.5}) if s.sharding == "no_shard" else s for s in profile.steps
    ]
    fitted = fit_parameters(profile.model_copy(update={"steps": steps}), base=base, precision="fp32")
    assert fitted.compute_scale == base.compute_scale


def test_one_step_of_an_engine_does_not_set_its_activation_scale() -> None:
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x1xH100"), "bf16")
    truth = base.with_changes(compiled_activation_memory_scale=1.4)
    one_compiled = [shape for shape in MEMORY_SHAPES if not shape[2].get("compile")] + [(1, 4, COMPILED)]
    profile = gpu_profile_with_memory(truth, one_compiled, usable=None, device=None)
    fitted = fit_parameters(profile, base=base, precision="bf16")
    assert fitted.compiled_activation_memory_scale == 1.0
    # What it missed shows as a residual: the margin widens instead.
    assert fitted.memory_margin > 0.03


def test_the_reserve_is_fitted_only_from_steps_under_the_launchers_allocator() -> None:
    # Reserved peaks measured without expandable segments hold the default allocator's fragmentation,
    # which a launched plan does not have: the fit keeps the uncalibrated reserve and margin, says why,
    # and judges the model on allocated peaks (which the allocator cannot change).
    base = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x1xH100"), "bf16")
    fragmented = base.with_changes(allocator_reserve=0.45)
    for config, recorded in (("", "PYTORCH_CUDA_ALLOC_CONF=''"), (None, "did not record its allocator")):
        profile = gpu_profile_with_memory(
            fragmented, MEMORY_SHAPES, usable=None, device=None, allocator_config=config
        )
        fitted = fit_parameters(profile, base=base, precision="bf16")
        assert fitted.allocator_reserve == base.allocator_reserve
        assert fitted.memory_margin == base.memory_margin  # though the allocated peaks are priced exactly
        reason = fitted.memory_margin_reason
        assert "largest under-prediction is 0.0%" in reason and "in allocated bytes" in reason
        assert recorded in reason and "reserve (5% of" in reason
        assert f"nor the uncalibrated margin {base.memory_margin:.0%}" in reason
    # The same peaks under the launchers' allocator are its reserve, and fitted.
    profile = gpu_profile_with_memory(fragmented, MEMORY_SHAPES, usable=None, device=None)
    fitted = fit_parameters(profile, base=base, precision="bf16")
    assert fitted.allocator_reserve == pytest.approx(0.45, rel=0.02)


@pytest.mark.parametrize(
    ("config", "priced"),
    [
        ("expandable_segments:True", True),
        ("max_split_size_mb:512, expandable_segments:true", True),
        ("expandable_segments:False", False),
        ("", False),
        (None, False),
    ],
)
def test_which_allocator_configs_are_the_priced_one(config: str | None, priced: bool) -> None:
    assert runs_priced_allocator(config) is priced


def test_an_older_profile_keeps_its_id_and_a_recorded_allocator_changes_it() -> None:
    profile = CalibrationProfile.model_validate(synthetic_profile(efficiency=0.7, overhead=1e-5, latency=1e-5,
                                                                  bandwidth=1e11))  # fmt: skip
    assert "allocator_config" not in profile.model_dump_json(exclude={"allocator_config"})
    recorded = profile.model_copy(update={"allocator_config": PRICED_ALLOCATOR_CONFIG})
    assert recorded.content_id() != profile.content_id()
    # The id an older profile had: the digest of its JSON, which had no such key (nor a HIP version,
    # nor grouped GEMMs).
    older_json = profile.model_dump_json(
        exclude={"allocator_config": True, "grouped_gemm": True, "fingerprint": {"hip_version"}}
    )
    assert profile.content_id() == "profile-" + hashlib.sha256(older_json.encode()).hexdigest()[:12]
