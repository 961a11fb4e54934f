"""The accuracy page: predicted vs measured over every validation run, and how the errors are spread;
then the published and measured runs of the corpus (planner/fidelity), each priced at its configuration.

Errors are the ones stored with each run by the runs API: (predicted − measured) / measured × 100, so a
positive step-time error means the plan promised a slower step than was measured. The corpus section
reads the stored fidelity report (api/services/fidelity.py), whose errors are fractions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from api.dashboard import charts
from api.dashboard import formatting as fmt
from api.dashboard.queries import RunWithPlan
from planner.fidelity.report import FidelityReport, RunResult


@dataclass(frozen=True)
class ErrorSummary:
    metric: str
    runs: int
    mean_abs_pct: float
    median_abs_pct: float
    p90_abs_pct: float
    bias_pct: float
    """Mean signed error: > 0 when predictions run high on average."""


def _finite(values: Sequence[float | None]) -> list[float]:
    """The values a summary or chart can use: rows stored before the API bounded its inputs may hold
    nulls or infinities (an error against a measured 5e-324 s), which would poison every statistic."""
    return [v for v in values if v is not None and math.isfinite(v)]


def summarize(metric: str, errors: Sequence[float | None]) -> ErrorSummary | None:
    errors = _finite(errors)
    if not errors:
        return None
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    return ErrorSummary(metric, len(errors), statistics.fmean(absolute), statistics.median(absolute), p90,
                        statistics.fmean(errors))


def _by_gpu(runs: Sequence[RunWithPlan]) -> dict[str, list[RunWithPlan]]:
    groups: dict[str, list[RunWithPlan]] = {}
    for item in runs:
        groups.setdefault(item.gpu, []).append(item)
    return dict(sorted(groups.items()))


def _scatter(
    runs: Sequence[RunWithPlan], *, chart_id: str, title: str, unit: str,
    predicted: Callable[[RunWithPlan], float | None], measured: Callable[[RunWithPlan], float | None],
    show: Callable[[float], str],
) -> charts.Chart | None:
    groups: dict[str, list[charts.Point]] = {}
    for gpu, items in _by_gpu(runs).items():
        points = groups.setdefault(gpu, [])
        for item in items:
            p, m = predicted(item), measured(item)
            if p is None or m is None or not (math.isfinite(p) and math.isfinite(m)):
                continue
            tooltip = (f"{item.plan_name} (plan {item.run.plan_id}, run {item.run.id}): "
                       f"predicted {show(p)}, measured {show(m)}")
            points.append(charts.Point(p, m, tooltip, href=f"/plans/{item.run.plan_id}"))
    values = [v for points in groups.values() for p in points for v in (p.x, p.y)]
    return _predicted_vs_measured(groups, chart_id=chart_id, title=title, unit=unit, show=show,
                                  log=charts.should_use_log(values, ratio=20))


def _predicted_vs_measured(
    groups: dict[str, list[charts.Point]], *, chart_id: str, title: str, unit: str,
    show: Callable[[float], str], log: bool,
) -> charts.Chart | None:
    """One series per GPU type (colours in the order of `groups`), against the y = x line."""
    series = [
        charts.Series(gpu, points, charts.PALETTE[index % len(charts.PALETTE)])
        for index, (gpu, points) in enumerate(groups.items()) if points
    ]
    if not series:
        return None
    return charts.xy_chart(
        chart_id=chart_id, title=title, series=series, x_label=f"predicted {unit}",
        y_label=f"measured {unit}", x_format=show, y_format=show, x_log=log, y_log=log,
        guides=[charts.GuideLine(label="y = x (perfect prediction)", diagonal=True)],
    )


def step_time_chart(runs: Sequence[RunWithPlan]) -> charts.Chart | None:
    return _scatter(runs, chart_id="step-time-chart", title="Predicted vs measured step time",
                    unit="step time", predicted=lambda r: r.run.predicted_step_time_s,
                    measured=lambda r: r.run.measured_step_time_s, show=fmt.duration)


def memory_chart(runs: Sequence[RunWithPlan]) -> charts.Chart | None:
    return _scatter(runs, chart_id="memory-accuracy-chart", title="Predicted vs measured peak memory",
                    unit="peak memory", predicted=lambda r: r.run.predicted_peak_memory_gib,
                    measured=lambda r: r.run.measured_peak_memory_gib, show=fmt.gib)


def error_histogram(runs: Sequence[RunWithPlan]) -> charts.Chart | None:
    step = _finite([r.run.step_time_error_pct for r in runs])
    memory = _finite([r.run.peak_memory_error_pct for r in runs])
    if not step:
        return None
    return charts.histogram(
        chart_id="error-histogram", title="Distribution of prediction errors",
        series=[("step time", step, charts.PALETTE[0]), ("peak memory", memory, charts.PALETTE[1])],
        x_label="prediction error, (predicted − measured) / measured", x_format=lambda v: f"{v:+.0f}%",
    )


def summaries(runs: Sequence[RunWithPlan]) -> list[ErrorSummary]:
    found = [
        summarize("step time", [r.run.step_time_error_pct for r in runs]),
        summarize("tokens/s per GPU", [r.run.tokens_per_s_error_pct for r in runs]),
        summarize("peak memory", [r.run.peak_memory_error_pct for r in runs]),
    ]
    return [s for s in found if s is not None]


def _throughput(value: float) -> str:
    return f"{fmt.thousands(value)} tok/s"


def corpus_throughput_chart(report: FidelityReport) -> charts.Chart | None:
    """Predicted against measured tokens/s per GPU of every priced corpus run that publishes them, by GPU
    type, on log axes (the corpus spans small models on many GPUs and large ones on few: decades apart)."""
    groups: dict[str, list[charts.Point]] = {}
    speed_unpriced = corpus_speed_unpriced(report)
    for r in sorted(report.runs, key=lambda r: r.gpu):
        p, m = r.predicted_tokens_per_s_per_gpu, r.measured_tokens_per_s_per_gpu
        if not r.priced or p is None or m is None or not (math.isfinite(p) and math.isfinite(m)):
            continue
        if r in speed_unpriced:
            continue  # a point far off the line that says nothing of the model: named under the chart
        band = r.throughput_interval  # on tokens/s here: the run publishes them
        tooltip = (f"{r.source} / {r.run_id} ({r.config}): predicted {_throughput(p)}"
                   + (f" (80%: {fmt.interval(band)})" if band else "")
                   + f", measured {_throughput(m)}, error {fmt.signed_fraction(r.throughput_error)}")
        groups.setdefault(r.gpu, []).append(
            charts.Point(p, m, tooltip, x_range=charts.Ends(*band) if band else None)
        )
    return _predicted_vs_measured(
        groups, chart_id="corpus-throughput-chart", title="Published and measured runs: tokens/s per GPU",
        unit="tokens/s per GPU", show=fmt.compact_number, log=True,
    )


def corpus_runs(report: FidelityReport) -> list[RunResult]:
    """Every run, priced ones first, each group by source then run (the order of the corpus files)."""
    return sorted(report.runs, key=lambda r: (not r.priced, r.source, r.run_id))


def corpus_speed_unpriced(report: FidelityReport) -> list[RunResult]:
    """Priced runs whose tokens/s the corpus does not price, though it publishes them: their GPUs ran
    under a power cap the source does not state, so their clock is unknown (planner/fidelity/schema.py
    `Run.speed_priced`); their memory is priced. The throughput chart leaves them out and names them,
    rather than plotting a point far off the line that says nothing of the cost model."""
    return [
        r for r in report.runs
        if r.priced and r.throughput_error is None
        and r.predicted_tokens_per_s_per_gpu is not None and r.measured_tokens_per_s_per_gpu is not None
    ]
