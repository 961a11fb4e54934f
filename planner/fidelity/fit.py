"""Fit the cost model's corpus shares (planner/cost/parameters.py `CorpusFit`) to the measured runs.

Three shares of what the datasheets give (matmul throughput, elementwise bandwidth, compute left
beside a collective) are searched on a grid, one at a time in turn from the committed values, to
minimise the mean |log(predicted / measured)| throughput, each source weighing as much as any other
(so that a source with many rows cannot outvote the rest). The memory margin is the largest memory
under-prediction plus a step. Leave-one-source-out refits without a source, then predicts it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from planner.catalog.gpus import resolve_gpu
from planner.cost.parameters import CORPUS_FIT, CorpusFit, CostParameters, default_parameters
from planner.fidelity.pricing import NotPriceable, PricedRun, price_run, run_request
from planner.fidelity.schema import Run, SourceFile

MATMUL_SHARES = tuple(round(0.60 + 0.025 * i, 3) for i in range(17))  # 0.60 .. 1.00
BANDWIDTH_SHARES = tuple(round(0.20 + 0.05 * i, 2) for i in range(13))  # 0.20 .. 0.80
CONTENTIONS = tuple(round(0.05 * i, 2) for i in range(11))  # 0.00 .. 0.50
MARGIN_STEP = 0.02
"""Added to the largest under-prediction: the next run will not be the corpus' worst by exactly 0."""
ROUNDS = 3


@dataclass(frozen=True, slots=True)
class SourceRun:
    source: str
    run: Run


def corpus_runs(corpus: Iterable[SourceFile]) -> list[SourceRun]:
    return [SourceRun(f.source.id, run) for f in corpus for run in f.runs]


def run_parameters(run: Run, fit: CorpusFit) -> CostParameters:
    """The uncalibrated parameters `run` is priced with under `fit`."""
    request = run_request(run)
    cluster = request.cluster
    return default_parameters(cluster.resolved_gpu(), cluster, request.training.precision, fit)


def price(runs: Sequence[SourceRun], fit: CorpusFit) -> list[tuple[SourceRun, PricedRun]]:
    """Every priceable run at its exact configuration under `fit`."""
    priced = []
    for item in runs:
        if not item.run.priceable:
            continue
        priced.append((item, price_run(item.run, parameters=run_parameters(item.run, fit))))
    return priced


def _objective(priced: Sequence[tuple[SourceRun, PricedRun]]) -> float:
    by_source: dict[str, list[float]] = {}
    for item, result in priced:
        error = result.throughput_error
        if error is not None and _gpu_in_catalog(item.run):
            by_source.setdefault(item.source, []).append(abs(math.log1p(error)))
    return statistics.fmean(statistics.fmean(v) for v in by_source.values()) if by_source else 0.0


def _gpu_in_catalog(run: Run) -> bool:
    return resolve_gpu(run.hardware.gpu).name != "cpu"


def memory_margin(priced: Sequence[tuple[SourceRun, PricedRun]]) -> tuple[float, str]:
    """The margin the corpus calls for, and its reason in words a plan shows."""
    errors = [(result.memory_error, item) for item, result in priced if result.memory_error is not None]
    if not errors:
        return CORPUS_FIT.memory_margin, CORPUS_FIT.memory_margin_reason
    worst = max(0.0, -min(error for error, _ in errors))
    margin = math.ceil((worst + MARGIN_STEP) * 100) / 100
    sources = len({item.source for _, item in errors})
    reason = (
        f"uncalibrated: against {len(errors)} measured peaks of published and own GPU runs "
        f"({sources} sources; `fsdp-planner fidelity`), the memory model under-predicts by at most "
        f"{worst:.1%}; {margin:.0%} covers that with {MARGIN_STEP:.0%} to spare"
    )
    return margin, reason


def fit_corpus(
    runs: Sequence[SourceRun], *, start: CorpusFit = CORPUS_FIT, rounds: int = ROUNDS
) -> CorpusFit:
    """The shares that price `runs` best (coordinate search over the grids from `start`)."""
    current = start
    best = _objective(price(runs, current))
    axes = (
        ("matmul_share", MATMUL_SHARES),
        ("elementwise_bandwidth_share", BANDWIDTH_SHARES),
        ("overlap_contention", CONTENTIONS),
    )
    for _ in range(rounds):
        moved = False
        for name, grid in axes:
            for value in grid:
                if value == getattr(current, name):
                    continue
                candidate = replace(current, **{name: value})
                score = _objective(price(runs, candidate))
                if score < best - 1e-9:
                    best, current, moved = score, candidate, True
        if not moved:
            break
    margin, reason = memory_margin(price(runs, current))
    return replace(current, memory_margin=margin, memory_margin_reason=reason)


def leave_one_source_out(
    runs: Sequence[SourceRun], fitted: CorpusFit
) -> dict[str, list[tuple[SourceRun, PricedRun]]]:
    """Per source: its runs priced by a fit made without it (warm-started from `fitted`)."""
    out: dict[str, list[tuple[SourceRun, PricedRun]]] = {}
    for source in sorted({item.source for item in runs}):
        held_out = [item for item in runs if item.source == source]
        if not any(item.run.priceable for item in held_out):
            continue
        rest = [item for item in runs if item.source != source]
        fit = fit_corpus(rest, start=fitted, rounds=1)
        out[source] = price(held_out, fit)
    return out


__all__ = ["NotPriceable", "SourceRun", "corpus_runs", "fit_corpus", "leave_one_source_out", "price"]
