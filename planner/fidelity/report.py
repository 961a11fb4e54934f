"""The fidelity report: every corpus run priced at its exact configuration, its errors, and the targets.

Errors are (predicted - measured) / measured. Summaries are per GPU type, per source and per quantity
(throughput: tokens/s per GPU, or MFU where only that is published; memory: peak per GPU in the run's
own counter), in-sample (the committed corpus fit) and leave-one-source-out (the fit made without the
source, then that source predicted). The targets are the ones the project holds itself to; the report
says which are met.

Building it with leave-one-source-out refits the shares once per source (about a minute); the service
serves the stored report (`REPORT_RESOURCE`, written by `fsdp-planner fidelity --write`, which a test
keeps in step with the code and the corpus).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict

from planner import PLANNER_VERSION
from planner.cost.parameters import CORPUS_FIT, CorpusFit
from planner.fidelity.fit import Prices, SourceRun, corpus_runs, leave_one_source_out, price
from planner.fidelity.pricing import PricedRun, run_engine
from planner.fidelity.schema import SourceFile, load_corpus

REPORT_PACKAGE = "planner.fidelity"
REPORT_RESOURCE = "report.json"
MIN_RUNS_FOR_GPU_TARGETS = 5
THROUGHPUT_MEAN_TARGET = 0.10
THROUGHPUT_MAX_TARGET = 0.20
MEMORY_MEAN_TARGET = 0.08
LOSO_RATIO_TARGET = 1.5
Quantity = Literal["throughput", "memory"]


class ReportModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunResult(ReportModel):
    """One corpus run: what was measured, what the planner predicts at its configuration."""

    source: str
    run_id: str
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
    by_source: tuple[ErrorSummary, ...]
    by_quantity: tuple[ErrorSummary, ...]
    targets: tuple[TargetCheck, ...]


def _label(priced: PricedRun) -> str:
    label = priced.plan.config.label()
    attention = priced.run.config.attention
    return label if attention == "flash2" else f"{label}, {attention} attention"


def _result(item: SourceRun, priced: PricedRun | None, reason: str | None) -> RunResult:
    run = item.run
    measured = run.measured
    fields = dict(
        source=item.source, run_id=run.id, gpu=run.hardware.gpu, engine=run_engine(run),
        trainer=run.config.engine, measured_tokens_per_s_per_gpu=measured.tokens_per_s_per_gpu,
        measured_mfu=measured.mfu_percent / 100 if measured.mfu_percent else None,
        memory_counter=measured.memory_counter,
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


def _targets(by_gpu: Sequence[ErrorSummary], by_quantity: Sequence[ErrorSummary],
             results: Sequence[RunResult]) -> list[TargetCheck]:
    checks = []
    for s in by_gpu:
        if s.quantity != "throughput" or s.runs < MIN_RUNS_FOR_GPU_TARGETS:
            continue
        checks.append(TargetCheck(
            name=f"throughput mean |error| on {s.group} ({s.runs} runs)",
            target=f"<= {THROUGHPUT_MEAN_TARGET:.0%}", value=f"{s.mean_abs:.1%}",
            met=s.mean_abs <= THROUGHPUT_MEAN_TARGET,
        ))
        checks.append(TargetCheck(
            name=f"throughput max |error| on {s.group} ({s.runs} runs)",
            target=f"<= {THROUGHPUT_MAX_TARGET:.0%}", value=f"{s.max_abs:.1%}",
            met=s.max_abs <= THROUGHPUT_MAX_TARGET,
        ))
    for s in by_quantity:
        if s.quantity == "memory":
            checks.append(TargetCheck(
                name=f"memory mean |error| ({s.runs} runs)", target=f"<= {MEMORY_MEAN_TARGET:.0%}",
                value=f"{s.mean_abs:.1%}", met=s.mean_abs <= MEMORY_MEAN_TARGET,
            ))
        if s.loso_mean_abs is not None:
            ratio = s.loso_mean_abs / s.mean_abs if s.mean_abs else 1.0
            checks.append(TargetCheck(
                name=f"{s.quantity}: leave-one-source-out mean |error| / in-sample",
                target=f"<= {LOSO_RATIO_TARGET:g}x",
                value=f"{s.loso_mean_abs:.1%} / {s.mean_abs:.1%} = {ratio:.2f}x",
                met=ratio <= LOSO_RATIO_TARGET,
            ))
    over = [f"{r.source}/{r.run_id}" for r in results if r.exceeds_margin]
    checks.append(TargetCheck(
        name="runs whose measured peak exceeds the predicted peak plus the stated margin",
        target="none", value=", ".join(over) if over else "none", met=not over,
    ))
    return checks


def build_report(
    corpus: Iterable[SourceFile] | None = None, *, fit: CorpusFit = CORPUS_FIT, loso: bool = True
) -> FidelityReport:
    """Price every corpus run under `fit`; with `loso`, also each source under a fit made without it."""
    runs = corpus_runs(load_corpus() if corpus is None else corpus)
    prices = Prices()  # the refits start from `fit`: they reprice what the in-sample pricing did
    in_sample = {(item.source, item.run.id): result for item, result in price(runs, fit, prices)}
    held_out: dict[tuple[str, str], PricedRun] = {}
    if loso:
        for source_runs in leave_one_source_out(runs, fit, prices=prices).values():
            held_out.update({(item.source, item.run.id): result for item, result in source_runs})
    results = []
    for item in runs:
        key = (item.source, item.run.id)
        if not item.run.priceable:
            results.append(_result(item, None, item.run.not_priceable_reason))
            continue
        result = _result(item, in_sample[key], None)
        if key in held_out:
            other = held_out[key]
            result = result.model_copy(update={
                "loso_throughput_error": other.throughput_error, "loso_memory_error": other.memory_error,
            })
        results.append(result)
    priced = [r for r in results if r.priced]
    by_gpu = _summaries(priced, lambda r: r.gpu)
    by_quantity = _summaries(priced, lambda r: "all")
    return FidelityReport(
        planner_version=PLANNER_VERSION,
        fit=asdict(fit),
        sources=len({item.source for item in runs}),
        runs=tuple(results),
        by_gpu=tuple(by_gpu),
        by_source=tuple(_summaries(priced, lambda r: r.source)),
        by_quantity=tuple(by_quantity),
        targets=tuple(_targets(by_gpu, by_quantity, priced)),
    )


def stored_report() -> FidelityReport:
    """The report written by `fsdp-planner fidelity --write` (what the service serves)."""
    text = resources.files(REPORT_PACKAGE).joinpath(REPORT_RESOURCE).read_text(encoding="utf-8")
    return FidelityReport.model_validate_json(text)


def report_json(report: FidelityReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=1, sort_keys=False) + "\n"


__all__ = ["FidelityReport", "build_report", "report_json", "stored_report"]
