"""The fidelity report: every corpus run priced at its exact configuration, its errors, and the targets.

Errors are (predicted - measured) / measured. Summaries are per GPU type, per source and per quantity
(throughput: tokens/s per GPU, or MFU where only that is published; memory: peak per GPU in the run's
own counter), for the fit split in-sample (the committed corpus fit) and leave-one-source-out (the fit
made without the source, then that source predicted), and for the held-out split, which no fit reads
(planner/fidelity/split.py). The held-out residuals calibrate the 80% intervals
(planner/fidelity/intervals.py, stored as `INTERVALS_RESOURCE`); each held-out run's interval is
calibrated on the other held-out sources, and the share of runs inside it is the coverage. The
targets are the ones the project holds itself to, on both splits; the report says which are met.

Building it with leave-one-source-out refits the shares once per source (about a minute); the service
serves the stored report (`REPORT_RESOURCE`, written by `fsdp-planner fidelity --write`, which a test
keeps in step with the code and the corpus).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from planner import PLANNER_VERSION
from planner.cost.parameters import CORPUS_FIT, CorpusFit
from planner.fidelity import intervals
from planner.fidelity.fit import Prices, SourceRun, corpus_runs, fit_split, leave_one_source_out, price
from planner.fidelity.pricing import PricedRun, run_cluster, run_engine, run_model
from planner.fidelity.schema import SourceFile, load_corpus
from planner.fidelity.split import split_of
from planner.uncertainty import LEVEL

REPORT_PACKAGE = "planner.fidelity"
REPORT_RESOURCE = "report.json"
MIN_RUNS_FOR_GPU_TARGETS = 5
THROUGHPUT_MEAN_TARGET = 0.10
THROUGHPUT_MAX_TARGET = 0.20
MEMORY_MEAN_TARGET = 0.08
LOSO_RATIO_TARGET = 1.5
HELD_OUT_THROUGHPUT_MEAN_TARGET = 0.12
HELD_OUT_THROUGHPUT_MAX_TARGET = 0.30
HELD_OUT_MEMORY_MEAN_TARGET = 0.10
COVERAGE_TARGET = 0.75
"""Of the held-out runs, the share the 80% interval (calibrated without their source) contains."""
MOE_THROUGHPUT_MEAN_TARGET = 0.15
MOE_MEMORY_MEAN_TARGET = 0.12
MOE_MIN_RUNS = 12
MOE_MIN_SOURCES = 3
"""Issue 40's targets for published mixture-of-experts runs: at least 12 from 3 sources, priced as run;
they are held out and reported apart from the dense runs' splits (their own errors: the all-to-alls,
the router and the grouped GEMMs)."""
UNSEEN_GPU_THROUGHPUT_MEAN_TARGET = 0.15
UNSEEN_GPU_MIN_RUNS = 8
UNSEEN_GPU_MIN_SOURCES = 2
"""Issue 43's targets for the GPU types no fit run measured (their catalog entries read from datasheets
and matmul benchmarks only): at least 8 priced runs from 2 sources, dense and mixture-of-experts alike."""
HELD_OUT_SOURCE_SHARE = 1 / 3
HELD_OUT_MIN_PRICED_RUNS = 25
"""Issue 37's rule for the held-out split: a third of the sources, 25 priced runs."""
"""Of the held-out runs, the share the 80% interval (calibrated without their source) contains."""
Quantity = Literal["throughput", "memory"]


class ReportModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunResult(ReportModel):
    """One corpus run: what was measured, what the planner predicts at its configuration."""

    source: str
    run_id: str
    split: Literal["fit", "held-out"] = "fit"
    """Whether the fit reads this run's source (planner/fidelity/split.json)."""
    gpu: str
    engine: str
    """The engine priced (`fsdp-planner` or `torchtitan`; planner/specs.py `Engine`)."""
    trainer: str
    """The trainer as the source names it."""
    config: str
    """The priced configuration's label (with the attention kernel's generation where it is not
    FlashAttention-2's)."""
    priced: bool
    reason: str | None = None
    """Why a run is not priced (float8, pipeline or context parallelism, ...)."""
    measured_tokens_per_s_per_gpu: float | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    measured_mfu: float | None = None
    predicted_mfu: float | None = None
    throughput_error: float | None = None
    loso_throughput_error: float | None = None
    memory_counter: str | None = None
    measured_memory_gib: float | None = None
    predicted_memory_gib: float | None = None
    memory_error: float | None = None
    loso_memory_error: float | None = None
    memory_margin: float | None = None
    """The margin the planner states for this plan."""
    exceeds_margin: bool = False
    """The measured peak is above the predicted one plus that margin."""
    throughput_interval: tuple[float, float] | None = None
    """The 80% interval on the predicted throughput (tokens/s per GPU, or MFU where only that is
    published), calibrated on the held-out sources other than this run's."""
    throughput_covered: bool | None = None
    memory_interval: tuple[float, float] | None = None
    """The 80% interval on the predicted peak (GiB, the run's counter), calibrated the same way."""
    memory_covered: bool | None = None
    network_assumed: bool = False
    """The run spans nodes and its source does not state the network: priced on the catalog's NIC,
    and its throughput scored against the GPU type's low and high plausible network."""
    moe: bool = False
    """The model is a mixture of experts: reported apart (`FidelityReport.moe_by_source`), not in the
    dense runs' split summaries."""


class ErrorSummary(ReportModel):
    """The errors of one quantity over a group of runs."""

    group: str
    quantity: Quantity
    runs: int
    mean_abs: float
    max_abs: float
    bias: float
    """Mean signed error: > 0 when predictions run high."""
    loso_mean_abs: float | None = None


class Coverage(ReportModel):
    """How many held-out runs the 80% interval contains (each calibrated without its source)."""

    quantity: Quantity
    runs: int
    covered: int
    fraction: float


class TargetCheck(ReportModel):
    name: str
    target: str
    value: str
    met: bool


class FidelityReport(ReportModel):
    planner_version: str
    fit: dict[str, float | str | dict[str, float] | tuple[dict[str, float | str], ...]]
    """The corpus shares the in-sample predictions use (planner/cost/parameters.py `CorpusFit`)."""
    sources: int
    runs: tuple[RunResult, ...]
    by_gpu: tuple[ErrorSummary, ...]
    """The fit split's runs per GPU type (in-sample, and leave-one-source-out)."""
    by_source: tuple[ErrorSummary, ...]
    by_quantity: tuple[ErrorSummary, ...]
    """The fit split's runs, all together."""
    held_out_by_gpu: tuple[ErrorSummary, ...] = ()
    """The held-out split's runs per GPU type (priced by the committed fit, which never read them)."""
    held_out_by_quantity: tuple[ErrorSummary, ...] = ()
    coverage: tuple[Coverage, ...] = ()
    moe_by_source: tuple[ErrorSummary, ...] = ()
    """Mixture-of-experts runs per source (held out, priced by the committed fit; not in the summaries
    above)."""
    moe_by_quantity: tuple[ErrorSummary, ...] = ()
    moe_coverage: tuple[Coverage, ...] = ()
    """Of the mixture-of-experts runs, how many their 80% interval contains."""
    unseen_gpu_by_gpu: tuple[ErrorSummary, ...] = ()
    """Every priced run (dense and mixture-of-experts) on a GPU type whose throughput no fit run measured,
    per GPU type and all together (`group` "all"): how the catalog's datasheet figures hold."""
    intervals: dict[str, Any] = {}
    """What `INTERVALS_RESOURCE` stores: the quantiles per group, the corpus' reach."""
    targets: tuple[TargetCheck, ...]


def _label(priced: PricedRun) -> str:
    label = priced.plan.config.label()
    attention = priced.run.config.attention
    return label if attention == "flash2" else f"{label}, {attention} attention"


def _result(item: SourceRun, priced: PricedRun | None, reason: str | None) -> RunResult:
    run = item.run
    measured = run.measured
    fields = dict(
        source=item.source, run_id=run.id, split=split_of(item.source), gpu=run.hardware.gpu,
        engine=run_engine(run),
        trainer=run.config.engine, measured_tokens_per_s_per_gpu=measured.tokens_per_s_per_gpu,
        measured_mfu=measured.mfu_percent / 100 if measured.mfu_percent else None,
        memory_counter=measured.memory_counter,
        network_assumed=run.hardware.network_gbps_per_node is None and run_cluster(run).num_nodes > 1,
        moe=run_model(run).moe is not None,
    )
    if priced is None:
        return RunResult(**fields, config="", priced=False, reason=reason)
    prediction = priced.plan.prediction
    return RunResult(
        **fields,
        config=_label(priced),
        priced=True,
        predicted_tokens_per_s_per_gpu=prediction.tokens_per_s_per_gpu,
        predicted_mfu=prediction.mfu,
        throughput_error=priced.throughput_error,
        measured_memory_gib=priced.measured_memory_gib,
        predicted_memory_gib=priced.predicted_memory_gib if priced.memory_error is not None else None,
        memory_error=priced.memory_error,
        memory_margin=priced.margin,
        exceeds_margin=priced.exceeds_margin,
    )


def _summaries(
    results: Sequence[RunResult], key: Callable[[RunResult], str], *, per_gpu_minimum: int = 0
) -> list[ErrorSummary]:
    out = []
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    for group, members in sorted(groups.items()):
        for quantity, errors, loso in (
            ("throughput", [r.throughput_error for r in members], [r.loso_throughput_error for r in members]),
            ("memory", [r.memory_error for r in members], [r.loso_memory_error for r in members]),
        ):
            values = [e for e in errors if e is not None]
            if not values:
                continue
            held_out = [abs(e) for e in loso if e is not None]
            out.append(
                ErrorSummary(
                    group=group, quantity=quantity, runs=len(values),  # type: ignore[arg-type]
                    mean_abs=statistics.fmean(abs(e) for e in values),
                    max_abs=max(abs(e) for e in values), bias=statistics.fmean(values),
                    loso_mean_abs=statistics.fmean(held_out) if held_out else None,
                )
            )
    return out


def _gpu_targets(
    by_gpu: Sequence[ErrorSummary], mean: float, maximum: float, split: str
) -> list[TargetCheck]:
    checks = []
    for s in by_gpu:
        if s.quantity != "throughput" or s.runs < MIN_RUNS_FOR_GPU_TARGETS:
            continue
        checks.append(TargetCheck(
            name=f"{split}: throughput mean |error| on {s.group} ({s.runs} runs)",
            target=f"<= {mean:.0%}", value=f"{s.mean_abs:.1%}", met=s.mean_abs <= mean,
        ))
        checks.append(TargetCheck(
            name=f"{split}: throughput max |error| on {s.group} ({s.runs} runs)",
            target=f"<= {maximum:.0%}", value=f"{s.max_abs:.1%}", met=s.max_abs <= maximum,
        ))
    return checks


def _targets(by_gpu: Sequence[ErrorSummary], by_quantity: Sequence[ErrorSummary],
             results: Sequence[RunResult], held_out_by_gpu: Sequence[ErrorSummary],
             held_out_by_quantity: Sequence[ErrorSummary], coverage: Sequence[Coverage]) -> list[TargetCheck]:
    checks = _gpu_targets(by_gpu, THROUGHPUT_MEAN_TARGET, THROUGHPUT_MAX_TARGET, "fit")
    for s in by_quantity:
        if s.quantity == "memory":
            checks.append(TargetCheck(
                name=f"fit: memory mean |error| ({s.runs} runs)", target=f"<= {MEMORY_MEAN_TARGET:.0%}",
                value=f"{s.mean_abs:.1%}", met=s.mean_abs <= MEMORY_MEAN_TARGET,
            ))
        if s.loso_mean_abs is not None:
            ratio = s.loso_mean_abs / s.mean_abs if s.mean_abs else 1.0
            checks.append(TargetCheck(
                name=f"fit: {s.quantity}: leave-one-source-out mean |error| / in-sample",
                target=f"<= {LOSO_RATIO_TARGET:g}x",
                value=f"{s.loso_mean_abs:.1%} / {s.mean_abs:.1%} = {ratio:.2f}x",
                met=ratio <= LOSO_RATIO_TARGET,
            ))
    checks += _gpu_targets(
        held_out_by_gpu, HELD_OUT_THROUGHPUT_MEAN_TARGET, HELD_OUT_THROUGHPUT_MAX_TARGET, "held-out"
    )
    for s in held_out_by_quantity:
        if s.quantity == "memory":
            checks.append(TargetCheck(
                name=f"held-out: memory mean |error| ({s.runs} runs)",
                target=f"<= {HELD_OUT_MEMORY_MEAN_TARGET:.0%}", value=f"{s.mean_abs:.1%}",
                met=s.mean_abs <= HELD_OUT_MEMORY_MEAN_TARGET,
            ))
    for c in coverage:
        checks.append(TargetCheck(
            name=f"held-out: {c.quantity} inside the {LEVEL:.0%} interval (calibrated without their source)",
            target=f">= {COVERAGE_TARGET:.0%}", value=f"{c.covered} of {c.runs} = {c.fraction:.0%}",
            met=c.fraction >= COVERAGE_TARGET,
        ))
    sources = {r.source: r.split for r in results}
    held_out_sources = sum(split == "held-out" for split in sources.values())
    checks.append(TargetCheck(
        name="held-out split: sources", target=f">= {HELD_OUT_SOURCE_SHARE:.0%} of {len(sources)}",
        value=str(held_out_sources), met=held_out_sources >= HELD_OUT_SOURCE_SHARE * len(sources),
    ))
    priced_held_out = sum(r.priced and r.split == "held-out" for r in results)
    checks.append(TargetCheck(
        name="held-out split: priced runs", target=f">= {HELD_OUT_MIN_PRICED_RUNS}",
        value=str(priced_held_out), met=priced_held_out >= HELD_OUT_MIN_PRICED_RUNS,
    ))
    checks += _moe_targets(results)
    checks += _unseen_gpu_targets(results)
    over = [f"{r.source}/{r.run_id}" for r in results if r.exceeds_margin]
    checks.append(TargetCheck(
        name="runs whose measured peak exceeds the predicted peak plus the stated margin",
        target="none", value=", ".join(over) if over else "none", met=not over,
    ))
    return checks


def _moe_targets(results: Sequence[RunResult]) -> list[TargetCheck]:
    """Issue 40's: the mixture-of-experts runs' count, sources, mean errors and intervals."""
    priced = [r for r in results if r.priced and r.moe]
    if not priced:
        return []
    sources = len({r.source for r in priced})
    checks = [TargetCheck(
        name="MoE: priced runs (sources)", target=f">= {MOE_MIN_RUNS} ({MOE_MIN_SOURCES})",
        value=f"{len(priced)} ({sources})", met=len(priced) >= MOE_MIN_RUNS and sources >= MOE_MIN_SOURCES,
    )]
    # The peaks: few published MoE runs state one, so how many (and from how many sources) the memory
    # mean stands on is a target of its own, held to the same count as the priced runs.
    peaks = [r for r in priced if r.memory_error is not None]
    peak_sources = len({r.source for r in peaks})
    checks.append(TargetCheck(
        name="MoE: priced runs with a measured peak (sources)",
        target=f">= {MOE_MIN_RUNS} ({MOE_MIN_SOURCES})", value=f"{len(peaks)} ({peak_sources})",
        met=len(peaks) >= MOE_MIN_RUNS and peak_sources >= MOE_MIN_SOURCES,
    ))
    for s in _summaries(priced, lambda r: "all"):
        goal = MOE_THROUGHPUT_MEAN_TARGET if s.quantity == "throughput" else MOE_MEMORY_MEAN_TARGET
        error = "throughput_error" if s.quantity == "throughput" else "memory_error"
        sources_of = len({r.source for r in priced if getattr(r, error) is not None})
        checks.append(TargetCheck(
            name=f"MoE: {s.quantity} mean |error| ({s.runs} runs, {sources_of} sources)",
            target=f"<= {goal:.0%}", value=f"{s.mean_abs:.1%}", met=s.mean_abs <= goal,
        ))
    for quantity, flag in (("throughput", "throughput_covered"), ("memory", "memory_covered")):
        inside = [r for r in priced if getattr(r, flag) is not None]
        out = [r.run_id for r in inside if not getattr(r, flag)]
        if inside:
            value = f"{len(inside) - len(out)} of {len(inside)}"
            value += f" (out: {', '.join(out)})" if out else ""
            checks.append(TargetCheck(
                name=f"MoE: {quantity} runs inside their {LEVEL:.0%} interval", target="all", value=value,
                met=not out,
            ))
    return checks


def unseen_gpus(results: Sequence[RunResult]) -> frozenset[str]:
    """The GPU types of priced runs that no fit-split run with a throughput error was measured on."""
    fitted = {r.gpu for r in results if r.priced and r.split == "fit" and r.throughput_error is not None}
    return frozenset(r.gpu for r in results if r.priced and r.gpu not in fitted)


def _unseen_gpu_results(results: Sequence[RunResult]) -> list[RunResult]:
    unseen = unseen_gpus(results)
    return [r for r in results if r.priced and r.gpu in unseen and r.throughput_error is not None]


def _unseen_gpu_targets(results: Sequence[RunResult]) -> list[TargetCheck]:
    """Issue 43's: the runs on GPU types the fit never measured, their count, sources and mean error."""
    runs = _unseen_gpu_results(results)
    if not runs:
        return []
    sources = len({r.source for r in runs})
    gpus = ", ".join(sorted({r.gpu for r in runs}))
    (total,) = [s for s in _summaries(runs, lambda r: "all") if s.quantity == "throughput"]
    return [
        TargetCheck(
            name=f"GPU types no fit run measured ({gpus}): priced runs (sources)",
            target=f">= {UNSEEN_GPU_MIN_RUNS} ({UNSEEN_GPU_MIN_SOURCES})", value=f"{len(runs)} ({sources})",
            met=len(runs) >= UNSEEN_GPU_MIN_RUNS and sources >= UNSEEN_GPU_MIN_SOURCES,
        ),
        TargetCheck(
            name=f"GPU types no fit run measured: throughput mean |error| ({total.runs} runs)",
            target=f"<= {UNSEEN_GPU_THROUGHPUT_MEAN_TARGET:.0%}", value=f"{total.mean_abs:.1%}",
            met=total.mean_abs <= UNSEEN_GPU_THROUGHPUT_MEAN_TARGET,
        ),
    ]


def _coverage(results: Sequence[RunResult]) -> list[Coverage]:
    coverage = []
    for quantity, flag in (("throughput", "throughput_covered"), ("memory", "memory_covered")):
        inside = [getattr(r, flag) for r in results if getattr(r, flag) is not None]
        if inside:
            coverage.append(Coverage(quantity=quantity, runs=len(inside), covered=sum(inside),  # type: ignore[arg-type]
                                     fraction=sum(inside) / len(inside)))
    return coverage


def optimistic_gpus(results: Sequence[RunResult]) -> dict[str, dict[str, float]]:
    """GPU types every held-out priced run of which ran slower than predicted and outside its interval
    (the runs, their largest over-prediction): where the corpus measured the type and the model missed
    it, its plans say so (planner/uncertainty.py) rather than read as covered."""
    by_gpu: dict[str, list[RunResult]] = {}
    for r in results:
        if r.throughput_error is not None and r.throughput_covered is not None:
            by_gpu.setdefault(r.gpu, []).append(r)
    return {
        gpu: {"runs": len(runs), "worst": round(max(r.throughput_error or 0.0 for r in runs), 3)}
        for gpu, runs in sorted(by_gpu.items())
        if all(not r.throughput_covered and (r.throughput_error or 0.0) > 0 for r in runs)
    }


def _interval(center: float | None, band: tuple[float, float], q: float) -> tuple[float, float] | None:
    if center is None:
        return None
    return center * band[0] * math.exp(-q), center * band[1] * math.exp(q)


def _with_intervals(
    result: RunResult, found: dict[str, dict[tuple[str, str], tuple[intervals.Residual, float, bool]]]
) -> RunResult:
    """`result` with its 80% intervals (on the quantity its error compares)."""
    key = (result.source, result.run_id)
    update: dict[str, Any] = {}
    if key in found["throughput"]:
        residual, q, inside = found["throughput"][key]
        tokens = result.measured_tokens_per_s_per_gpu is not None
        center = result.predicted_tokens_per_s_per_gpu if tokens else result.predicted_mfu
        update |= {"throughput_interval": _interval(center, residual.band, q), "throughput_covered": inside}
    if key in found["memory"]:
        residual, q, inside = found["memory"][key]
        update |= {"memory_interval": _interval(result.predicted_memory_gib, residual.band, q),
                   "memory_covered": inside}
    return result.model_copy(update=update)


def _placed(
    residuals: dict[str, list[intervals.Residual]], calibration: dict[str, list[dict[str, Any]]],
    held_out_calibration: dict[str, list[intervals.Residual]],
) -> dict[str, dict[tuple[str, str], tuple[intervals.Residual, float, bool]]]:
    """Per quantity and run: its residual, the quantile of its interval and whether it covers the run
    (held-out runs: calibrated without their source; fit runs: on the whole calibration)."""
    out: dict[str, dict[tuple[str, str], tuple[intervals.Residual, float, bool]]] = {}
    for quantity, found in residuals.items():
        held_out = [r for r in found if r.split == "held-out"]
        extra = [r for r in held_out_calibration[quantity] if r.split == "fit"]
        crossed = intervals.cross_validated(held_out, extra)
        placed = {}
        for r in found:
            key = (r.source, r.run_id)
            if key in crossed:
                placed[key] = (r, crossed[key]["q"], crossed[key]["covered"])
            elif r.split == "fit":
                group = intervals.find_group(calibration[quantity], gpu=r.gpu, chip=r.chip, dims=r.dims)
                placed[key] = (r, max(0.0, group["q"]), intervals.covered(r, calibration[quantity]))
        out[quantity] = placed
    return out


def build_report(
    corpus: Iterable[SourceFile] | None = None, *, fit: CorpusFit = CORPUS_FIT, loso: bool = True
) -> FidelityReport:
    """Price every corpus run under `fit`; with `loso`, also each fit source under a fit made without
    it; calibrate the intervals on the held-out split."""
    runs = corpus_runs(load_corpus() if corpus is None else corpus)
    prices = Prices()  # the refits start from `fit`: they reprice what the in-sample pricing did
    priced_runs = price(runs, fit, prices)
    dense_runs = [(item, result) for item, result in priced_runs if run_model(item.run).moe is None]
    in_sample = {(item.source, item.run.id): result for item, result in priced_runs}
    held_out: dict[tuple[str, str], PricedRun] = {}
    if loso:
        for source_runs in leave_one_source_out(fit_split(runs), fit, prices=prices).values():
            held_out.update({(item.source, item.run.id): result for item, result in source_runs})
    by_split = {
        split: intervals.residuals(
            [(item, result) for item, result in priced_runs if split_of(item.source) == split],
            fit=fit, prices=prices, split=split,
        )
        for split in ("fit", "held-out")
    }
    calibration_residuals = intervals.calibrate(by_split["held-out"], by_split["fit"])
    calibration = {quantity: intervals.groups(found) for quantity, found in calibration_residuals.items()}
    placed = _placed(
        {q: [*by_split["fit"][q], *by_split["held-out"][q]] for q in calibration}, calibration,
        calibration_residuals,
    )
    results = []
    for item in runs:
        key = (item.source, item.run.id)
        if not item.run.priceable:
            results.append(_result(item, None, item.run.not_priceable_reason))
            continue
        result = _with_intervals(_result(item, in_sample[key], None), placed)
        if key in held_out:
            other = held_out[key]
            result = result.model_copy(update={
                "loso_throughput_error": other.throughput_error, "loso_memory_error": other.memory_error,
            })
        results.append(result)
    # Mixture-of-experts runs are reported apart, with their own targets (`_moe_targets`).
    priced = [r for r in results if r.priced and r.split == "fit" and not r.moe]
    unseen = [r for r in results if r.priced and r.split == "held-out" and not r.moe]
    experts = [r for r in results if r.priced and r.moe]
    unseen_gpu = _unseen_gpu_results(results)
    by_gpu = _summaries(priced, lambda r: r.gpu)
    by_quantity = _summaries(priced, lambda r: "all")
    held_out_by_gpu = _summaries(unseen, lambda r: r.gpu)
    held_out_by_quantity = _summaries(unseen, lambda r: "all")
    coverage = _coverage(unseen)
    return FidelityReport(
        planner_version=PLANNER_VERSION,
        fit=asdict(fit),
        sources=len({item.source for item in runs}),
        runs=tuple(results),
        by_gpu=tuple(by_gpu),
        by_source=tuple(_summaries([r for r in results if r.priced and not r.moe], lambda r: r.source)),
        by_quantity=tuple(by_quantity),
        held_out_by_gpu=tuple(held_out_by_gpu),
        held_out_by_quantity=tuple(held_out_by_quantity),
        coverage=tuple(coverage),
        moe_by_source=tuple(_summaries(experts, lambda r: r.source)),
        moe_by_quantity=tuple(_summaries(experts, lambda r: "all")),
        moe_coverage=tuple(_coverage(experts)),
        unseen_gpu_by_gpu=tuple(
            s for s in (*_summaries(unseen_gpu, lambda r: r.gpu), *_summaries(unseen_gpu, lambda r: "all"))
            if s.quantity == "throughput"
        ),
        intervals={
            "level": LEVEL,
            "written_by": "fsdp-planner fidelity --write (planner/fidelity/intervals.py)",
            **calibration,
            # What dense plans' caveats read: the dense runs' pairs and reach (MoE runs stay apart).
            "lead": intervals.lead_calibration(
                [(item, result) for item, result in dense_runs if split_of(item.source) == "held-out"]
            ),
            # The GPU types any priced run measured (a mixture of experts' too), and those whose every
            # held-out run, dense or not, ran slower than priced and outside its interval.
            "reach": {
                **intervals.reach(dense_runs),
                "gpus": intervals.reach(priced_runs)["gpus"],
                "optimistic_gpus": optimistic_gpus([r for r in results if r.split == "held-out"]),
            },
        },
        targets=tuple(
            _targets(by_gpu, by_quantity, results, held_out_by_gpu, held_out_by_quantity, coverage)
        ),
    )


def stored_report() -> FidelityReport:
    """The report written by `fsdp-planner fidelity --write` (what the service serves)."""
    text = resources.files(REPORT_PACKAGE).joinpath(REPORT_RESOURCE).read_text(encoding="utf-8")
    return FidelityReport.model_validate_json(text)


def report_json(report: FidelityReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=1, sort_keys=False) + "\n"


def intervals_json(report: FidelityReport) -> str:
    """What `INTERVALS_RESOURCE` stores (planner/uncertainty.py reads it)."""
    return json.dumps(report.intervals, indent=1) + "\n"


__all__ = [
    "FidelityReport", "build_report", "intervals_json", "optimistic_gpus", "report_json", "stored_report",
]
