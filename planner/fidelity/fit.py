"""Fit the cost model's corpus shares (planner/cost/parameters.py `CorpusFit`) to the measured runs.

Shares of what the datasheets give (the matmul throughput training reaches, per chip with enough
runs; elementwise bandwidth; compute left beside a collective) are searched on a grid, one at a time
in turn from the committed values, to minimise the mean |log(predicted / measured)| throughput, each
source weighing as much as any other (so that a source with many rows cannot outvote the rest).
The memory margin is the largest memory under-prediction plus a step. Leave-one-source-out refits
without a source, then predicts it.

Only the fit split's sources are fitted (planner/fidelity/split.py): every fit here refuses a
held-out source, so that the held-out runs stay a test of the model.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, fields, replace

from contract.mesh import MODEL_PARALLEL_AXES
from planner.catalog.gpus import GpuSpec, resolve_gpu
from planner.cost.memory import MARGIN_DIMENSIONS, margin_dimension
from planner.cost.parameters import (
    CORPUS_FIT,
    CorpusFit,
    CostParameters,
    DimensionMargin,
    DimensionThroughput,
    default_parameters,
    power_density,
)
from planner.errors import PlanningError
from planner.fidelity.pricing import NotPriceable, PricedRun, price_as_run, price_run, run_request
from planner.fidelity.schema import Run, SourceFile
from planner.fidelity.split import require_fit_sources, split_of

MATMUL_SHARES = tuple(round(0.60 + 0.025 * i, 3) for i in range(17))  # 0.60 .. 1.00
BANDWIDTH_SHARES = tuple(round(0.20 + 0.05 * i, 2) for i in range(13))  # 0.20 .. 0.80
CONTENTIONS = tuple(round(0.05 * i, 2) for i in range(11))  # 0.00 .. 0.50
MARGIN_STEP = 0.02
"""Added to the largest under-prediction: the next run will not be the corpus' worst by exactly 0."""
ROUNDS = 3
MIN_CHIP_RUNS = 5
"""A chip gets a matmul share of its own with at least this many priced throughput runs."""


@dataclass(frozen=True, slots=True)
class SourceRun:
    source: str
    run: Run


def corpus_runs(corpus: Iterable[SourceFile]) -> list[SourceRun]:
    return [SourceRun(f.source.id, run) for f in corpus for run in f.runs]


def fit_split(runs: Iterable[SourceRun]) -> list[SourceRun]:
    """The runs of the sources the fit may read (planner/fidelity/split.json)."""
    return [item for item in runs if split_of(item.source) == "fit"]


def run_parameters(run: Run, fit: CorpusFit) -> CostParameters:
    """The uncalibrated parameters `run` is priced with under `fit`."""
    request = run_request(run)
    cluster = request.cluster
    return default_parameters(cluster.resolved_gpu(), cluster, request.training.precision, fit)


class Prices:
    """Runs priced under fits, each run once per set of parameters it is priced with: a coordinate
    search, and every leave-one-source-out refit that starts where the full fit ended, price the
    same run with the same parameters again and again (a share of another chip changes nothing of
    it). Holds the runs it has priced, so that it is meant for one fit or report."""

    def __init__(self) -> None:
        self._priced: dict[tuple[int, Hashable], PricedRun] = {}
        self._runs: list[Run] = []

    def __call__(self, item: SourceRun, fit: CorpusFit) -> PricedRun:
        parameters = run_parameters(item.run, fit)
        key = (id(item.run), _frozen(parameters))
        if key not in self._priced:
            self._runs.append(item.run)  # alive while its id is a key
            self._priced[key] = price_run(item.run, parameters=parameters)
        return self._priced[key]


def _frozen(value: object) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if hasattr(value, "__dataclass_fields__"):
        return (type(value).__name__, *(_frozen(getattr(value, f.name)) for f in fields(value)))  # type: ignore[arg-type]
    return value  # type: ignore[return-value]


def price(
    runs: Sequence[SourceRun], fit: CorpusFit, prices: Prices | None = None
) -> list[tuple[SourceRun, PricedRun]]:
    """Every priceable run at its exact configuration under `fit` (through `prices`, if given)."""
    prices = prices or Prices()
    return [(item, prices(item, fit)) for item in runs if item.run.priceable]


def _objective(priced: Sequence[tuple[SourceRun, PricedRun]]) -> float:
    by_source: dict[str, list[float]] = {}
    for item, result in priced:
        error = result.throughput_error
        if error is not None and _gpu_in_catalog(item.run):
            by_source.setdefault(item.source, []).append(abs(math.log1p(error)))
    return statistics.fmean(statistics.fmean(v) for v in by_source.values()) if by_source else 0.0


def _gpu_in_catalog(run: Run) -> bool:
    return not resolve_gpu(run.hardware.gpu).is_cpu


def memory_margin(priced: Sequence[tuple[SourceRun, PricedRun]]) -> tuple[float, str]:
    """The margin the corpus calls for, and its reason in words a plan shows."""
    errors = [(result.memory_error, item) for item, result in priced if result.memory_error is not None]
    if not errors:
        return CORPUS_FIT.memory_margin, CORPUS_FIT.memory_margin_reason
    margin, worst = _covering(error for error, _ in errors)
    sources = len({item.source for _, item in errors})
    reason = (
        f"uncalibrated: against {len(errors)} measured peaks of published and own GPU runs "
        f"({sources} sources; `fsdp-planner fidelity`), the memory model has under-predicted by at most "
        f"{worst:.1%}; {margin:.0%} covers that with {MARGIN_STEP:.0%} to spare"
    )
    return margin, reason


def _covering(errors: Iterable[float]) -> tuple[float, float]:
    """The margin on a predicted peak that covers the worst of `errors` (predicted / measured - 1)
    with a step to spare, and that worst under-prediction as a fraction of the measured peak: a
    prediction (1 - w) of the measured peak needs w / (1 - w) on top of it."""
    worst = max(0.0, -min(errors))
    return math.ceil((worst / (1.0 - worst) + MARGIN_STEP) * 100) / 100, worst


THROUGHPUT_TOLERANCE = 0.15
"""How far a prediction of tokens/s may be above a published run's before the plans that share its
parallel dimension are warned (the tolerance issue 21 holds throughput predictions to)."""
THROUGHPUT_DIMENSIONS = tuple(sorted(MODEL_PARALLEL_AXES, key=lambda axis: axis != "cp"))
"""The dimensions a run's throughput evidence falls under, the one priced least surely first: a
pipeline of context-parallel stages is evidence about context parallelism's attention, which the
schedules' pricing does not touch."""


def _meshed(runs: Sequence[SourceRun], fit: CorpusFit) -> list[tuple[SourceRun, PricedRun]]:
    """Every run with a parallel dimension beyond data parallelism, priced at its exact
    configuration and recipe whether or not the report prices it yet (Float8, pipelines and
    context parallelism are checked by their benchmarks; what they measured still says how far
    the model is off)."""
    priced = []
    for item in runs:
        mesh = item.run.config.mesh
        if mesh.model_parallel == 1:
            continue
        try:
            priced.append((item, price_as_run(item.run, parameters=run_parameters(item.run, fit))))
        except PlanningError:
            continue
    return priced


def dimension_margins(
    meshed: Sequence[tuple[SourceRun, PricedRun]], base: float
) -> tuple[DimensionMargin, ...]:
    """Per parallel dimension, the margin its corpus runs call for, where wider than `base`: every
    run whose mesh falls to that dimension (`margin_dimension`: its outermost one) and published its
    peak."""
    errors: dict[str, list[tuple[float, str]]] = {dimension: [] for dimension in MARGIN_DIMENSIONS}
    for item, priced in meshed:
        mesh = item.run.config.mesh
        dimension = margin_dimension(mesh)
        if dimension is not None and priced.memory_error is not None:
            errors[dimension].append((priced.memory_error, item.source))
    margins = []
    for dimension, found in errors.items():
        if not found:
            continue
        margin, worst = _covering(error for error, _ in found)
        if margin <= base:
            continue
        sources = len({source for _, source in found})
        margins.append(DimensionMargin(dimension, margin, (
            f"uncalibrated, with {MARGIN_DIMENSIONS[dimension]} parallelism: against {len(found)} measured "
            f"peaks of published runs that used it ({sources} source{'s' if sources > 1 else ''}; "
            f"`fsdp-planner fidelity` lists the corpus), the memory model has under-predicted by at most "
            f"{worst:.1%}; {margin:.0%} covers that with {MARGIN_STEP:.0%} to spare"
        )))
    return tuple(margins)


def dimension_throughput(meshed: Sequence[tuple[SourceRun, PricedRun]]) -> tuple[DimensionThroughput, ...]:
    """Per parallel dimension (`THROUGHPUT_DIMENSIONS`: a run falls under the first it uses), the
    evidence that its plans run slower than priced: from the smallest degree at which a published
    run was over-predicted past `THROUGHPUT_TOLERANCE`, how many of the runs at that degree or more
    were, and by how much at most. None where no run was."""
    found: dict[str, list[tuple[int, float, str]]] = {dimension: [] for dimension in THROUGHPUT_DIMENSIONS}
    for item, priced in meshed:
        mesh, error = item.run.config.mesh, priced.throughput_error
        dimension = next((d for d in THROUGHPUT_DIMENSIONS if getattr(mesh, d) > 1), None)
        if dimension is not None and error is not None:
            found[dimension].append((getattr(mesh, dimension), error, item.source))
    evidence = []
    for dimension, runs in found.items():
        over = [degree for degree, error, _ in runs if error > THROUGHPUT_TOLERANCE]
        if not over:
            continue
        degree = min(over)
        covered = [(error, source) for d, error, source in runs if d >= degree]
        worst = max(error for error, _ in covered)
        sources = len({source for _, source in covered})
        name = MARGIN_DIMENSIONS[dimension]
        evidence.append(DimensionThroughput(dimension, degree, round(worst, 3), (
            f"optimistic throughput: of {len(covered)} published runs with {name} parallelism at "
            f"{dimension}={degree} or more ({sources} source{'s' if sources > 1 else ''}; `fsdp-planner "
            f"fidelity` lists the corpus, bench/RESULTS.md prices them), {len(over)} ran more than "
            f"{THROUGHPUT_TOLERANCE:.0%} slower than the model prices them, up to {1 + worst:.2f}x: take "
            f"this plan's tokens/s as an upper bound until a run on the target GPUs measures it"
        )))
    return tuple(evidence)


def _speed_gpus(runs: Sequence[SourceRun]) -> list[GpuSpec]:
    """The GPU of each priced run whose speed is compared (what a chip's share is fitted to)."""
    return [
        resolve_gpu(item.run.hardware.gpu) for item in runs
        if item.run.priceable and item.run.throughput_comparable
    ]


def fitted_chips(runs: Sequence[SourceRun]) -> list[str]:
    """Chips with enough priced throughput runs for a matmul share of their own."""
    counts = Counter(gpu.chip for gpu in _speed_gpus(runs) if gpu.chip)
    return sorted(chip for chip, n in counts.items() if n >= MIN_CHIP_RUNS)


def _with(fit: CorpusFit, axis: str, value: float) -> CorpusFit:
    if axis.startswith("chip:"):
        return replace(fit, matmul_share_by_chip={**fit.matmul_share_by_chip, axis[5:]: value})
    return replace(fit, **{axis: value})


def _value(fit: CorpusFit, axis: str) -> float:
    return _chip_share(fit, axis[5:]) if axis.startswith("chip:") else getattr(fit, axis)


def _chip_share(fit: CorpusFit, chip: str) -> float:
    return fit.matmul_share_by_chip.get(chip, fit.matmul_share)


def chip_densities(runs: Sequence[SourceRun]) -> dict[str, float]:
    """Per chip, the mean power density (dense TFLOP/s per board watt) of the GPUs its priced
    throughput runs ran on (an H100 SXM and an H200 at 1.41, not the H20 cut from the same die)."""
    by_chip: dict[str, list[float]] = {}
    for gpu in _speed_gpus(runs):
        if gpu.chip and gpu.board_power_w:
            by_chip.setdefault(gpu.chip, []).append(power_density(gpu))
    return {chip: statistics.fmean(densities) for chip, densities in by_chip.items()}


def density_share(shares: dict[str, float], densities: dict[str, float]) -> float:
    """`CorpusFit.matmul_share` from the fitted chips' shares: each times the cube root of its runs'
    power density, averaged over the chips."""
    return statistics.fmean(share * densities[chip] ** (1.0 / 3.0) for chip, share in shares.items())


def fit_corpus(
    runs: Sequence[SourceRun],
    *,
    start: CorpusFit = CORPUS_FIT,
    rounds: int = ROUNDS,
    prices: Prices | None = None,
) -> CorpusFit:
    """The shares that price `runs` best, and the memory margins their measured peaks call for.
    Raises HeldOutSourceError when `runs` hold a held-out source (select them with `fit_split`)."""
    require_fit_sources(item.source for item in runs)
    prices = prices or Prices()
    current = _fit_shares(runs, start=start, rounds=rounds, prices=prices)
    margin, reason = memory_margin(price(runs, current, prices))
    meshed = _meshed(runs, current)
    return replace(
        current,
        memory_margin=margin,
        memory_margin_reason=reason,
        dimension_margins=dimension_margins(meshed, margin),
        dimension_throughput=dimension_throughput(meshed),
    )


def _fit_shares(runs: Sequence[SourceRun], *, start: CorpusFit, rounds: int, prices: Prices) -> CorpusFit:
    """The shares that price `runs` best (coordinate search over the grids from `start`); the
    margins stay `start`'s."""
    require_fit_sources(item.source for item in runs)
    chips = fitted_chips(runs)
    current = replace(
        start, matmul_share_by_chip={chip: _chip_share(start, chip) for chip in chips}
    )
    best = _objective(price(runs, current, prices))
    axes = (
        *((f"chip:{chip}", MATMUL_SHARES) for chip in chips),
        ("elementwise_bandwidth_share", BANDWIDTH_SHARES),
        ("overlap_contention", CONTENTIONS),
    )
    for _ in range(rounds):
        moved = False
        for axis, grid in axes:
            for value in grid:
                if value == _value(current, axis):
                    continue
                candidate = _with(current, axis, value)
                score = _objective(price(runs, candidate, prices))
                if score < best - 1e-9:
                    best, current, moved = score, candidate, True
        if not moved:
            break
    if chips:  # chips the corpus cannot fit take the power density law through the fitted ones
        shares = current.matmul_share_by_chip
        current = replace(current, matmul_share=round(density_share(shares, chip_densities(runs)), 3))
    return current


def leave_one_source_out(
    runs: Sequence[SourceRun], fitted: CorpusFit, *, prices: Prices | None = None
) -> dict[str, list[tuple[SourceRun, PricedRun]]]:
    """Per fit source: its runs priced by a fit made without it (warm-started from `fitted`)."""
    require_fit_sources(item.source for item in runs)
    prices = prices or Prices()
    out: dict[str, list[tuple[SourceRun, PricedRun]]] = {}
    for source in sorted({item.source for item in runs}):
        held_out = [item for item in runs if item.source == source]
        if not any(item.run.priceable for item in held_out):
            continue
        rest = [item for item in runs if item.source != source]
        # Only the shares are refitted: the errors the report reads do not depend on the margins.
        fit = _fit_shares(rest, start=fitted, rounds=1, prices=prices)
        out[source] = price(held_out, fit, prices)
    return out


__all__ = [
    "NotPriceable", "Prices", "SourceRun", "chip_densities", "corpus_runs", "density_share", "fit_corpus",
    "fit_split", "leave_one_source_out", "price",
]
