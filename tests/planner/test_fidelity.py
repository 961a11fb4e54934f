"""The corpus of measured runs and the fidelity report: the corpus is what issue 21 asks for and
validates against its schema; a malformed file is refused naming the field; the report's errors do not
regress past the committed thresholds (GUARD); the stored report the service serves is the one the code
and the corpus give today."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from planner.cost.gemm import sequence_scale
from planner.cost.parameters import CORPUS_FIT
from planner.fidelity import intervals
from planner.fidelity.fit import Prices, SourceRun
from planner.fidelity.pricing import ATTENTION_KERNEL_SPEED, price_run, run_config, run_request
from planner.fidelity.report import (
    MIN_RUNS_FOR_GPU_TARGETS,
    MOE_MEMORY_MEAN_TARGET,
    FidelityReport,
    RunResult,
    _moe_targets,
    build_report,
    intervals_json,
    stored_report,
)
from planner.fidelity.schema import CORPUS_PACKAGE, CorpusError, Run, load_corpus, parse_source_file
from planner.search import predict
from planner.uncertainty import INTERVALS_RESOURCE, interval_data

GUARD: dict[tuple[str, str], float] = {
    ("throughput_mean", "A100-40GB"): 0.08,
    ("throughput_max", "A100-40GB"): 0.14,
    ("throughput_mean", "A100-80GB"): 0.05,
    ("throughput_max", "A100-80GB"): 0.15,
    ("throughput_mean", "H100-SXM-80GB"): 0.09,
    ("throughput_max", "H100-SXM-80GB"): 0.17,
    ("throughput_mean", "H100-SXM-96GB"): 0.06,
    ("throughput_max", "H100-SXM-96GB"): 0.13,
    ("throughput_mean", "H200-141GB"): 0.10,
    ("throughput_max", "H200-141GB"): 0.15,
    ("memory_mean", "all"): 0.07,
}
"""The fit split's in-sample |error| each target may reach: today's values rounded up to the next whole
percent (HELD_OUT_GUARD holds the held-out split's the same way).
A change that makes a prediction worse fails here; one that makes it better should lower these.
(2026-11-28: the power-capped B200 run left the fit, whose shares then moved: H100-96GB's max and
H200's mean rose to 19.9% and 9.9%, A100-40GB's mean to 7.5%, while the other A100 and H100-80GB
figures fell. Later that day async TP left the backward's input-gradient reduce-scatters exposed, as
inductor's micro-pipelining does, and the refit moved the overlap contention 0.3 -> 0.25 and GA100's
share 0.9 -> 0.875: H100-96GB's max fell to 17.3% and its mean to 5.7%, A100-40GB's mean rose to
8.3% and A100-80GB's max to 16.5%, H100-80GB's max to 21.9%. Issue 37 split the corpus: the fit
reads the fit split only, and its refit moved the overlap contention 0.25 -> 0.5 and the elementwise
bandwidth share 0.5 -> 0.55. GEMMs priced by shape and attention by sequence length (issue 37 item 2)
moved the matmul shares up by 0.025 on refit; torchao's H100 run is priced on the card its peak was
logged on, the 96 GB H100 at 500 W (item 7), and H100-80GB's max fell from 21.9% to 16.9%.)"""
HELD_OUT_GUARD: dict[tuple[str, str], float] = {
    ("throughput_mean", "A100-80GB"): 0.11,
    ("throughput_max", "A100-80GB"): 0.18,
    ("throughput_mean", "H100-SXM-80GB"): 0.09,
    ("throughput_max", "H100-SXM-80GB"): 0.19,
    ("throughput_mean", "H200-141GB"): 0.11,
    ("throughput_max", "H200-141GB"): 0.27,
    ("memory_mean", "all"): 0.08,
}
"""The held-out split's |error| (sources no fit reads, priced by the committed fit), today's values
rounded up to the next whole percent: the numbers that say how the model does on runs it never saw.
(2026-11-28: other trainers' compiled blocks priced with what inductor's partitioner saves moved the
held-out memory mean from 11.5% to 7.8%; OLMo-core's eight H100 runs joined the split at 4.9%.
2026-11-29: KempnerForge's fourteen H200 runs, 1-32 GPUs, joined at 10.5% mean, 26.0% max: its pure-FSDP
and single-GPU runs priced 15-26% slow, its tp runs within 10%.)"""
COVERAGE_GUARD = {"throughput": 0.75, "memory": 0.75}
"""The least share of held-out runs the 80% interval contains (each calibrated without its source): the
issue's 75% for tokens/s and for peaks (today 32 of 36 runs and 6 of 7 peaks: torchtune's pure-bf16
single-GPU runs and Lightning's FSDP2 runs, bf16 and float8; Lightning's Llama-3-8B peaks and
torchtune's compiled row are kept but not compared: `Measured.memory_not_comparable` says why)."""
GPU_FAMILIES = ({"A100-80GB", "A100-40GB"}, {"H100-SXM-80GB", "H100-SXM-96GB"}, {"H200-141GB", "B200"})
STANDARD_NODE_GPUS = 8
"""What a run that does not state its node size is priced on (planner/fidelity/schema.py `Hardware`)."""
TOLERANCE = 1e-9


def _runs() -> list[Run]:
    return [run for source_file in load_corpus() for run in source_file.runs]


def _nodes(run: Run) -> int:
    hardware = run.hardware
    if hardware.nodes is not None:
        return hardware.nodes
    return math.ceil(run.config.mesh.world_size / (hardware.gpus_per_node or STANDARD_NODE_GPUS))


# ---------------------------------------------------------------- the corpus


def test_every_corpus_file_validates() -> None:
    names = sorted(e.name for e in resources.files(CORPUS_PACKAGE).iterdir() if e.name.endswith(".json"))
    for name in names:  # one at a time, so that a failure names its file
        text = resources.files(CORPUS_PACKAGE).joinpath(name).read_text(encoding="utf-8")
        parse_source_file(name, text)
    assert [f"{f.source.id}.json" for f in load_corpus()] == names


def test_the_corpus_covers_what_issue_21_asks_for() -> None:
    corpus, runs = load_corpus(), _runs()
    assert len(runs) >= 30
    publishers = {f.source.publisher for f in corpus}
    assert len(publishers) >= 5, publishers
    gpus = {run.hardware.gpu for run in runs}
    assert all(family & gpus for family in GPU_FAMILIES), gpus
    assert {_nodes(run) == 1 for run in runs} == {True, False}, "single- and multi-node runs"
    assert {run.config.compile == "none" for run in runs} == {True, False}, "eager and compiled runs"
    assert {run.config.mesh.tp > 1 for run in runs} == {True, False}, "FSDP-only and FSDP + TP runs"
    policies = {run.config.checkpointing.policy for run in runs}
    assert len(policies) >= 3, policies


# ---------------------------------------------------------------- the schema


def _source_file() -> tuple[str, dict[str, Any]]:
    """A real corpus file (its name and data) whose first run states its nodes and GPUs per node."""
    for source_file in load_corpus():
        hardware = source_file.runs[0].hardware
        if hardware.nodes is not None and hardware.gpus_per_node is not None:
            name = f"{source_file.source.id}.json"
            text = resources.files(CORPUS_PACKAGE).joinpath(name).read_text(encoding="utf-8")
            return name, json.loads(text)
    raise AssertionError("no corpus file states the node size of its first run")


def _wrong_enum(data: dict[str, Any]) -> None:
    data["runs"][0]["config"]["checkpointing"]["policy"] = "sometimes"


def _missing_quote(data: dict[str, Any]) -> None:
    del data["runs"][0]["quote"]


def _unknown_attention_kernel(data: dict[str, Any]) -> None:
    data["runs"][0]["config"]["attention"] = "flash3-maybe"


def _mesh_not_the_gpus(data: dict[str, Any]) -> None:
    hardware = data["runs"][0]["hardware"]
    world = hardware["nodes"] * hardware["gpus_per_node"]
    data["runs"][0]["config"]["mesh"] = {"dp_shard": world + 1}


def _two_power_limits(data: dict[str, Any]) -> None:
    data["runs"][0]["hardware"].update(power_limit_w=500, power_limit_unstated=True)


@pytest.mark.parametrize(("spoil", "field"), [
    (_wrong_enum, "runs.0.config.checkpointing.policy"),
    (_two_power_limits, "runs.0.hardware"),
    (_missing_quote, "runs.0.quote"),
    (_unknown_attention_kernel, "runs.0.config.attention"),
    (_mesh_not_the_gpus, "config.mesh"),
])
def test_a_malformed_file_is_refused_naming_the_field(
    spoil: Callable[[dict[str, Any]], None], field: str
) -> None:
    name, data = _source_file()
    parse_source_file(name, json.dumps(data))  # as committed: valid
    spoil(data)
    with pytest.raises(CorpusError) as refused:
        parse_source_file(name, json.dumps(data))
    assert name in str(refused.value) and field in str(refused.value)


def test_a_file_named_after_another_source_is_refused() -> None:
    _, data = _source_file()
    with pytest.raises(CorpusError, match=r"source\.id .* must be the file's name"):
        parse_source_file("another-source.json", json.dumps(data))


def test_a_file_that_is_not_json_is_refused() -> None:
    name, data = _source_file()
    with pytest.raises(CorpusError, match=name):
        parse_source_file(name, json.dumps(data)[:-1])


def test_a_first_generation_attention_kernel_takes_twice_the_attention_time_and_nothing_else() -> None:
    # llm-foundry's benchmarks ran its Triton port of the first FlashAttention: at 65,536 tokens per
    # sequence attention is most of the step, and pricing it as FlashAttention-2 over-predicted by 48%.
    (run,) = [run for run in _runs() if run.id == "mpt-7b-a100-80-seq65536-8gpu"]
    assert run.config.attention == "flash1"
    as_run = price_run(run).plan.prediction
    as_flash2 = run.config.model_copy(update={"attention": "flash2"})
    flash2 = price_run(run.model_copy(update={"config": as_flash2}))
    model, seq_len = run.config.model, run.config.seq_len
    assert not isinstance(model, str)
    tokens = run.config.local_batch_size * run.config.grad_accum_steps * seq_len
    # Causal attention per token and layer: 2*seq*hidden forward; recomputed once (full checkpointing),
    # backward 2.5x; at the A100's FlashAttention-2 efficiency at this length, then at half of it.
    flops = 2 * seq_len * model.hidden_size * model.num_layers * tokens * (1 + 1 + 2.5)
    flash2_attention_s = flops / (312e12 * 0.6 * sequence_scale(seq_len))
    extra_s = flash2_attention_s * (1 / ATTENTION_KERNEL_SPEED["flash1"] - 1)
    assert as_run.compute_s - flash2.plan.prediction.compute_s == pytest.approx(extra_s, rel=1e-9)
    assert as_run.step_time_s - flash2.plan.prediction.step_time_s == pytest.approx(extra_s, rel=1e-9)
    assert as_run.peak_memory_gib == flash2.plan.prediction.peak_memory_gib


def test_an_aiter_attention_kernel_divides_the_attention_time_by_its_published_speed() -> None:
    # AMD's Primus runs Llama 3.1 70B with Primus-Turbo's attention (AITER's kernels), 3.05x the
    # torch flash op the catalog's MI325X figure describes. Attention's time at the catalog figure is
    # what the first generation's half speed adds to the run; AITER's saves 1 - 1/3.05 of it.
    (run,) = [run for run in _runs() if run.id == "mi325x-64gpu-llama3.1-70b-megatron-fsdp2-bf16"]
    assert run.config.attention == "aiter"

    def priced(kernel: str) -> Any:
        config = run.config.model_copy(update={"attention": kernel})
        return price_run(run.model_copy(update={"config": config}))

    aiter, flash2, flash1 = (priced(kernel).plan.prediction for kernel in ("aiter", "flash2", "flash1"))
    attention_s = flash1.compute_s - flash2.compute_s
    assert attention_s > 0.05 * flash2.compute_s
    saved_s = attention_s * (1 - 1 / ATTENTION_KERNEL_SPEED["aiter"])
    assert flash2.compute_s - aiter.compute_s == pytest.approx(saved_s, rel=1e-9)
    assert aiter.peak_memory_gib == flash2.peak_memory_gib


def test_a_run_on_cards_of_unstated_power_cap_is_priced_for_memory_not_tokens() -> None:
    # torchao's B200 table: "power limited" cards, the limit not given. At the catalog's clock its bf16
    # run was over-predicted by 110% and, in the fit, pulled the shares every other GPU is priced with.
    run = next(run for run in _runs() if run.hardware.power_limit_unstated and run.config.precision == "bf16")
    priced = price_run(run)
    assert priced.throughput_error is None
    assert priced.memory_error is not None and abs(priced.memory_error) < 0.15
    (result,) = [r for r in stored_report().runs if r.run_id == run.id]
    assert result.priced and result.throughput_error is None and result.memory_error is not None
    assert not any(s.group == run.hardware.gpu and s.quantity == "throughput" for s in stored_report().by_gpu)


def test_a_trainer_without_fsdp_holds_no_unsharded_copy_of_its_bf16_weights() -> None:
    # torchtune's single-device recipe trains its bf16 model in place: no FSDP unit gathers or casts a
    # copy, where this project's eager no_shard (FSDP2 on a group of one) does.
    runs = [run for run in _runs() if run.config.engine == "torchtune-single-device" and run.priceable]
    assert runs
    for run in runs:
        priced = price_run(run)
        assert priced.plan.prediction.memory_breakdown_gib.unsharded_params == 0.0, run.id
        # (A peak the corpus marks not comparable, the compiled row's fp32 logits cast in the model, is not.)
        assert (priced.memory_error is None) == bool(run.measured.memory_not_comparable), run.id
    eager = next(run for run in runs if run.config.compile == "none")
    as_fsdp2 = predict(run_request(eager), replace(run_config(eager), engine="fsdp-planner"), intervals=False)
    assert as_fsdp2.prediction.memory_breakdown_gib.unsharded_params > 5.0  # GiB: the 3B model's bf16 copy


def test_a_peak_no_planner_option_can_match_is_kept_but_not_compared() -> None:
    # Lightning's Llama-3-8B runs take the loss on bf16 logits, which no planner loss expresses, and
    # torchtune's compiled row casts its logits to fp32 in the model, outside the compiled loss.
    runs = [
        run for run in _runs()
        if run.measured.memory_not_comparable and run.priceable and run.throughput_comparable
    ]
    assert runs
    for run in runs:
        priced = price_run(run)
        assert priced.measured_memory_gib is not None and priced.throughput_error is not None
        assert priced.memory_error is None
    reported = {r.run_id: r for r in stored_report().runs}
    assert all(reported[run.id].memory_error is None for run in runs)
    assert all(reported[run.id].throughput_error is not None for run in runs)


def test_a_speed_that_measured_a_failure_is_kept_but_not_compared() -> None:
    # Lambda's GPT-OSS-20B batch 8 on GB300 ran at 98.7% of the device with the allocator thrashing
    # (the source's words): its peak is compared, its speed is not, and no fit or summary reads it.
    runs = [run for run in _runs() if run.measured.throughput_not_comparable and run.priceable]
    assert any(not run.measured.memory_not_comparable for run in runs)
    reported = {r.run_id: r for r in stored_report().runs}
    for run in runs:
        assert not run.throughput_comparable
        priced = price_run(run)
        assert priced.throughput_error is None and reported[run.id].throughput_error is None
        compared = not run.measured.memory_not_comparable  # a peak can be out of comparison too
        assert (priced.memory_error is not None) == compared, run.id
        assert (reported[run.id].memory_error is not None) == compared, run.id


# ---------------------------------------------------------------- the regression guard


def _guarded(by_gpu: Any, by_quantity: Any) -> dict[tuple[str, str], float]:
    """Today's value of every target a guard holds."""
    values = {}
    for s in by_gpu:
        if s.quantity == "throughput" and s.runs >= MIN_RUNS_FOR_GPU_TARGETS:
            values[("throughput_mean", s.group)] = s.mean_abs
            values[("throughput_max", s.group)] = s.max_abs
    for s in by_quantity:
        if s.quantity == "memory":
            values[("memory_mean", s.group)] = s.mean_abs
    return values


def _check(values: dict[tuple[str, str], float], guard: dict[tuple[str, str], float], name: str) -> None:
    unguarded = sorted(set(values) - set(guard))
    assert not unguarded, f"targets without a threshold: add {unguarded} to {name} (today's value rounded up)"
    worse = {key: f"{value:.2%} > {guard[key]:.0%}" for key, value in values.items() if value > guard[key]}
    assert not worse, f"prediction errors grew past the committed thresholds ({name}): {worse}"


@pytest.fixture(scope="module")
def report() -> FidelityReport:
    return build_report(loso=False)


def test_no_prediction_error_regresses_past_the_guard(report: FidelityReport) -> None:
    _check(_guarded(report.by_gpu, report.by_quantity), GUARD, "GUARD")
    over = [f"{r.source}/{r.run_id}" for r in report.runs if r.exceeds_margin]
    assert not over, f"measured peaks above the predicted peak plus the stated margin: {over}"


def test_no_held_out_error_regresses_past_the_held_out_guard(report: FidelityReport) -> None:
    _check(_guarded(report.held_out_by_gpu, report.held_out_by_quantity), HELD_OUT_GUARD, "HELD_OUT_GUARD")
    assert all(r.split == "fit" for r in report.runs if r.loso_throughput_error is not None)


def test_the_interval_contains_the_held_out_runs_it_promises(report: FidelityReport) -> None:
    coverage = {c.quantity: c for c in report.coverage}
    for quantity, least in COVERAGE_GUARD.items():
        c = coverage[quantity]
        assert c.fraction >= least, f"{quantity}: {c.covered} of {c.runs} held-out runs inside the interval"
    # Each held-out run's interval is its own (calibrated without its source) and says what it covers.
    held_out = [r for r in report.runs if r.split == "held-out" and r.throughput_error is not None]
    assert held_out and all(r.throughput_interval is not None for r in held_out)
    for r in held_out:
        assert r.throughput_interval is not None
        low, high = r.throughput_interval
        measured = r.measured_tokens_per_s_per_gpu or (r.measured_mfu or 0.0)
        assert r.throughput_covered == (low * (1 - 1e-9) <= measured <= high * (1 + 1e-9)), r.run_id
    # The dense runs' coverage is the issue's; mixture-of-experts runs are counted apart.
    assert sum(r.throughput_covered for r in held_out if not r.moe) == coverage["throughput"].covered
    experts = {c.quantity: c for c in report.moe_coverage}
    assert sum(r.throughput_covered for r in held_out if r.moe) == experts["throughput"].covered


def test_mixture_of_experts_peaks_are_summarised_apart_with_their_target(report: FidelityReport) -> None:
    # The corpus' MoE runs that state a peak comparable with the planner's (torchtitan's DeepSeek-V3
    # 671B on 512 H100s, before and after DeepEP): their memory errors are summarised with the MoE runs
    # and held to the MoE memory target, not folded into the dense held-out memory mean.
    peaks = [r for r in report.runs if r.moe and r.memory_error is not None]
    assert peaks
    (memory,) = [s for s in report.moe_by_quantity if s.quantity == "memory"]
    assert memory.runs == len(peaks)
    assert memory.mean_abs == pytest.approx(statistics.fmean(abs(r.memory_error or 0.0) for r in peaks))
    assert {s.group for s in report.moe_by_source if s.quantity == "memory"} == {r.source for r in peaks}
    sources = len({r.source for r in peaks})
    (target,) = [t for t in report.targets if t.name.startswith("MoE: memory mean |error|")]
    assert target.name == f"MoE: memory mean |error| ({len(peaks)} runs, {sources} sources)"
    assert target.target == f"<= {MOE_MEMORY_MEAN_TARGET:.0%}" == "<= 12%"
    assert target.met == (memory.mean_abs <= MOE_MEMORY_MEAN_TARGET)
    (count,) = [t for t in report.targets if t.name == "MoE: priced runs with a measured peak (sources)"]
    assert count.value == f"{len(peaks)} ({sources})"
    dense = [r for r in report.runs if r.split == "held-out" and not r.moe and r.memory_error is not None]
    (held_out,) = [s for s in report.held_out_by_quantity if s.quantity == "memory"]
    assert held_out.runs == len(dense)


def test_without_mixture_of_experts_peaks_no_moe_memory_target_is_claimed() -> None:
    def moe_run(index: int, memory_error: float | None) -> RunResult:
        return RunResult(source=f"source-{index % 3}", run_id=f"run-{index}", split="held-out",
                         gpu="H100-SXM-80GB", engine="torchtitan", trainer="torchtitan-fsdp2", config="",
                         priced=True, moe=True, throughput_error=0.1, memory_error=memory_error)

    speed_only = [moe_run(i, None) for i in range(12)]
    names = [t.name for t in _moe_targets(speed_only)]
    assert not any(n.startswith("MoE: memory mean") for n in names)
    (count,) = [t for t in _moe_targets(speed_only) if t.name.startswith("MoE: priced runs with a measured")]
    assert (count.value, count.met) == ("0 (0)", False)
    with_peaks = [moe_run(i, 0.2 if i < 2 else None) for i in range(12)]
    (memory,) = [t for t in _moe_targets(with_peaks) if t.name.startswith("MoE: memory mean")]
    assert memory.name == "MoE: memory mean |error| (2 runs, 2 sources)"
    assert (memory.target, memory.value, memory.met) == ("<= 12%", "20.0%", False)


def _residual(source: str, score: float, gpu: str = "H100-SXM-80GB") -> intervals.Residual:
    return intervals.Residual(source=source, run_id=f"{source}-{score}", gpu=gpu, chip="GH100", dims="dp",
                              score=score, split="held-out")


def test_a_groups_quantile_is_the_split_conformal_one_and_small_groups_pool() -> None:
    # n = 10 scores: the ceil(11 x 0.8) = 9th smallest, so that a new run is inside 80% of the time.
    scores = [0.01 * i for i in range(1, 11)]
    assert intervals.conformal_quantile(scores) == pytest.approx(0.09)
    found = [_residual("a" if i % 2 else "b", s) for i, s in enumerate(scores)]
    found += [_residual("c", 0.5, gpu="A100-80GB")]  # one A100 run: no group of its own
    by_key = {(g["gpu"], g["dims"]): g for g in intervals.groups(found)}
    assert ("A100-80GB", "*") not in by_key and by_key[("*", "*")]["runs"] == 11
    assert by_key[("H100-SXM-80GB", "dp")]["q"] == pytest.approx(0.09)
    a100 = intervals.find_group(intervals.groups(found), gpu="A100-80GB", chip="GA100", dims="dp")
    assert (a100["gpu"], a100["dims"]) == ("*", "dp")


def test_an_unstated_network_prices_a_band_over_the_gpu_types_plausible_networks() -> None:
    # IBM's 7B on 128 A100s states 400 Gb/s per node; unstated, it is priced on the catalog's NIC and
    # scored against the band between the A100's low and high plausible network.
    (run,) = [run for run in _runs() if run.id == "7b-a100-128gpu-eager"]
    hardware = run.hardware.model_copy(update={"network_gbps_per_node": None})
    unstated = run.model_copy(update={"hardware": hardware})
    prices = Prices()
    stated_item, unstated_item = SourceRun("s", run), SourceRun("s", unstated)
    found = intervals.residuals(
        [(item, prices(item, CORPUS_FIT)) for item in (stated_item, unstated_item)],
        fit=CORPUS_FIT, prices=prices, split="held-out",
    )["throughput"]
    stated, assumed = found
    assert stated.band == (1.0, 1.0)
    low, high = assumed.band
    assert low < 1.0 <= high  # the catalog's NIC is the A100's high edge: the band reaches down
    assert assumed.score <= max(0.0, stated.score) + 1e-9  # a band never scores a run further out


def test_a_run_whose_network_is_not_stated_says_so(report: FidelityReport) -> None:
    runs = {r.run_id: r for r in report.runs}
    for run in _runs():
        stated = run.hardware.network_gbps_per_node is not None
        assert runs[run.id].network_assumed == (not stated and _nodes(run) > 1), run.id
    assert any(r.network_assumed and r.priced for r in report.runs)


# ---------------------------------------------------------------- the stored report


def _same_fit(stored: Any, fresh: Any) -> bool:
    if isinstance(stored, dict) and isinstance(fresh, dict):
        return stored.keys() == fresh.keys() and all(_same_fit(stored[k], fresh[k]) for k in stored)
    if isinstance(stored, float | int) and isinstance(fresh, float | int):
        return math.isclose(stored, fresh, rel_tol=0, abs_tol=TOLERANCE)
    return bool(stored == fresh)


def _close(a: float | None, b: float | None) -> bool:
    return a is b is None or (a is not None and b is not None and math.isclose(a, b, abs_tol=TOLERANCE))


def test_the_projects_own_runs_cite_raw_records_inside_the_repository() -> None:
    root = Path(__file__).resolve().parents[2]
    for source_file in load_corpus():
        source = source_file.source
        assert not source.url.startswith("file:"), f"{source.id}: cite a record in the repository"
        if source.kind == "own-measurement":
            assert source.path and (root / source.path).is_file(), f"{source.id}: {source.path}"
            assert source.url == source.path


def test_the_stored_report_is_the_one_the_code_gives() -> None:
    """Leave-one-source-out refits once per source (about 13 s: a run is priced once per set of
    parameters, and most refits revisit the full fit's)."""
    stored, fresh = stored_report(), build_report(loso=True)
    rewrite = "; run `fsdp-planner fidelity --write` and commit planner/fidelity/report.json"
    changed = sorted(k for k in stored.fit.keys() | fresh.fit.keys()
                     if not _same_fit(stored.fit.get(k), fresh.fit.get(k)))
    assert not changed, f"the fit changed ({', '.join(changed)}){rewrite}"
    stored_runs = {(r.source, r.run_id): r for r in stored.runs}
    fresh_runs = {(r.source, r.run_id): r for r in fresh.runs}
    assert stored_runs.keys() == fresh_runs.keys(), f"the corpus changed{rewrite}"
    differ = [
        f"{source}/{run_id}"
        for (source, run_id), s in stored_runs.items()
        for f in [fresh_runs[(source, run_id)]]
        if s.priced != f.priced or not (_close(s.throughput_error, f.throughput_error)
                                        and _close(s.memory_error, f.memory_error))
    ]
    assert not differ, f"the stored errors of {len(differ)} runs are not today's ({differ[:5]}){rewrite}"
    stored_intervals = resources.files("planner.fidelity").joinpath(INTERVALS_RESOURCE).read_text("utf-8")
    assert json.loads(stored_intervals) == json.loads(intervals_json(fresh)), (
        f"planner/fidelity/{INTERVALS_RESOURCE} is not what the held-out runs give today{rewrite} and it"
    )
    assert interval_data()["throughput"] == fresh.intervals["throughput"]
