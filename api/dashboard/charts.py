"""The dashboard's charts as Plotly figures: scatter / line charts, stacked bars, timelines, histograms.

Charts are drawn in the browser by plotly.js (https://plotly.com/javascript/, MIT), served by this
server from the installed `plotly` Python package (api/dashboard/vendor.py), never from a CDN. This
module turns the views' data (points with tooltips and optional links, series, bars, spans) into a
figure (`{"data": [...], "layout": {...}}`) that the page carries as a JSON data island and
static/charts.js hands to `Plotly.newPlot`. Ticks are chosen and labelled here, so that byte sizes,
durations and money read as everywhere else in the product.

Without JavaScript a chart is a data table: every chart also lists what its marks say (`Chart.rows`),
which the page shows under the figure.

Safe by construction: numbers that JSON cannot hold (NaN, infinities) become nulls, which Plotly leaves
out; tooltips and labels are HTML-escaped (plotly.js renders a subset of HTML in them and labels come
from user input), and the island escapes `<`, `>` and `&` so that no text can close its `<script>`.
Each trace's `meta.class` names what it shows (`chosen`, `pareto`, `exposed`, `guide`...), for tests.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from markupsafe import Markup

from api.dashboard.formatting import compact_number
from planner.formatting import duration

# A qualitative palette that stays distinguishable for common colour-vision deficiencies (Okabe-Ito).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#999999")
EXPOSED_COLOR = "#d62728"
HIGHLIGHT_COLOR = "#d62728"
GUIDE_COLOR = "#555555"
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', sans-serif", "size": 12, "color": "#222222"}
MAX_LABEL_CHARS = 40

Formatter = Callable[[float], str]
Figure = dict[str, Any]


class Range(Protocol):
    """Two ends (a prediction's interval: planner.plan.PredictionInterval)."""

    @property
    def low(self) -> float: ...
    @property
    def high(self) -> float: ...


@dataclass(frozen=True)
class Ends:
    """A range given by its two ends (a fidelity report's (low, high))."""

    low: float
    high: float


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    tooltip: str
    href: str | None = None
    """A page of this site (`/plans/7`) that a click on the point opens."""
    x_range: Range | None = None
    """Where x may lie (a prediction's 80% interval): drawn as an error bar."""
    y_range: Range | None = None


@dataclass(frozen=True)
class Series:
    """Points drawn as markers, a line through them, or both."""

    name: str
    points: Sequence[Point]
    color: str
    markers: bool = True
    line: bool = False
    radius: float = 4.0
    css_class: str = ""
    """What the series is (e.g. `chosen`): the traces' `meta.class`, for tests and readers of the JSON."""
    ring: bool = False
    """Markers drawn as rings, for a point drawn over others at the same place (the chosen plan
    among its alternatives): a filled marker would hide them."""


@dataclass(frozen=True)
class GuideLine:
    """A labelled reference: vertical at `x` (e.g. GPU capacity) or the y = x diagonal."""

    label: str
    x: float | None = None
    diagonal: bool = False


@dataclass(frozen=True)
class Bar:
    """One horizontal bar made of named segments stacked left to right."""

    label: str
    segments: Sequence[tuple[str, float]]


@dataclass(frozen=True)
class Span:
    """One interval on a lane of a timeline."""

    lane: str
    start: float
    end: float
    color: str
    tooltip: str
    css_class: str = ""
    label: str = ""
    """Written inside the span when it is wide enough (aggregated timelines name their phases)."""
    short_label: str = ""
    """Written instead when `label` does not fit (e.g. only the duration)."""


@dataclass(frozen=True)
class Chart:
    """A figure for plotly.js and, for readers without JavaScript, the rows of its data table."""

    chart_id: str
    title: str
    figure: Figure
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...] = field(default=())

    def island(self) -> Markup:
        """The figure as JSON that is safe inside `<script type="application/json">`."""
        text = json.dumps(_json_safe(self.figure), allow_nan=False, separators=(",", ":"))
        for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                             ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
            text = text.replace(raw, escaped)
        return Markup(text)


def _json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN; Plotly skips nulls)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _text(value: str) -> str:
    """User text as plotly.js shows it: escaped, since it renders a subset of HTML in labels."""
    return html.escape(value, quote=False)


def _short(label: str, limit: int = MAX_LABEL_CHARS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


# ---------------------------------------------------------------- axes and ticks


def _log10(value: float) -> float:
    """log10 of a positive float, denormals and infinity included (never a math domain error)."""
    if value <= 0 or math.isnan(value):
        return _LOG_MIN
    return math.log10(value) if math.isfinite(value) else _LOG_MAX


_LOG_MIN = math.log10(sys.float_info.min)
"""About -308: the smallest decade a normal float reaches; denormals plot there."""
_LOG_MAX = math.log10(sys.float_info.max)


def _power(base: float, exponent: float) -> float:
    """base ** exponent clamped to the positive normal floats (no OverflowError, no 0)."""
    try:
        return min(max(base**exponent, sys.float_info.min), sys.float_info.max)
    except OverflowError:
        return sys.float_info.max


def nice_step(span: float, count: float) -> float:
    """A 1, 2 or 5 x 10^k step that cuts `span` into about `count` parts."""
    raw = span / max(count, 1)
    if not (math.isfinite(raw) and raw > 0):
        return 1.0
    power = _power(10.0, math.floor(math.log10(raw)))
    for multiple in (1, 2, 5, 10):
        if raw <= multiple * power:
            return multiple * power
    return 10 * power


MAX_TICKS = 50


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not hi > lo:
        return [lo]
    step = nice_step(hi / 2 - lo / 2, count / 2)  # halves: hi - lo may overflow, they cannot
    first = lo / step - 1e-9
    if not math.isfinite(first):
        return [lo, hi]
    first = math.ceil(first) * step
    # By index, not by adding `step` in a loop: at magnitudes where lo + step == lo that never ends.
    ticks = []
    for index in range(MAX_TICKS):
        value = first + index * step
        if not math.isfinite(value) or value > hi + step * 1e-9:
            break
        ticks.append(round(value, 12))
    ticks = sorted(set(ticks))
    return ticks if len(ticks) >= 2 else [lo, hi]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten inside [lo, hi]; also 2 and 5 times them when the range spans few decades."""
    first, last = math.floor(_log10(lo)), math.ceil(_log10(hi))
    multiples = (1, 2, 5) if last - first <= 3 else (1,)
    ticks = [m * _power(10.0, p) for p in range(first, last + 1) for m in multiples]
    inside = [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
    if len(inside) > 8:  # too many decades to label every one
        inside = inside[:: math.ceil(len(inside) / 8)]
    return inside or [lo, hi]


def binary_ticks(lo: float, hi: float, most: int = 7) -> list[float]:
    """Powers of two inside [lo, hi], every k-th so that at most `most` remain, on whole powers of 4."""
    first, last = math.ceil(_log10(lo) / math.log10(2)), math.floor(_log10(hi) / math.log10(2))
    if last < first:
        return [lo, hi]
    step = 2
    while (last - first) // step + 1 > most:
        step += 2
    start = first + (-first) % 2  # even exponents: 1 KiB, 4 KiB, ..., never 2 KiB next to 1 KiB
    return [_power(2.0, e) for e in range(start, last + 1, step)] or [_power(2.0, first)]


# The 1-2-5 sequence of log ticks: the round value before and after a tick of each mantissa.
_BEFORE_125 = {1: 0.5, 2: 0.5, 5: 0.4}
_AFTER_125 = {1: 2.0, 2: 2.5, 5: 2.0}


def _neighbour(ticks: Sequence[float], *, after: bool, log: bool, binary: bool) -> float | None:
    """The round value one step beyond the first (or the last) tick: the next multiple of the step
    (linear), power of two of the stride (binary), or 1-2-5 value (log: the next decade would leave up
    to a decade of empty chart)."""
    edge = ticks[-1] if after else ticks[0]
    if not log:
        if len(ticks) < 2:
            return None
        step = ticks[1] - ticks[0]
        return round(edge + step if after else edge - step, 12)
    ratio = ticks[1] / ticks[0] if len(ticks) >= 2 else (4.0 if binary else 10.0)
    mantissa = round(edge / _power(10.0, math.floor(_log10(edge))), 6)
    # Ticks a decade or less apart go on in 1-2-5 steps; ticks several decades apart keep their stride.
    if not binary and mantissa in _BEFORE_125 and ratio <= 10.0 * (1 + 1e-9):
        return edge * (_AFTER_125 if after else _BEFORE_125)[int(mantissa)]
    return edge * ratio if after else edge / ratio


MAX_ADDED_TICKS = 4
"""Steps `covering_ticks` may add on a side (1-2-5 steps: a decade is three)."""


def covering_ticks(
    lo: float, hi: float, data: Sequence[float], *, log: bool = False, binary: bool = False,
    ticks: Sequence[float] | None = None,
) -> tuple[float, float, list[float]]:
    """Ticks for [lo, hi], and the domain widened by round values on a side where the data reach past
    the outermost tick: a reader never has to guess a value beyond the labelled range (a Pareto front
    at $15.8M under ticks that start at $20M). Returns (lo, hi, ticks)."""
    if ticks is None:
        ticks = (binary_ticks(lo, hi) if binary else log_ticks(lo, hi)) if log else nice_ticks(lo, hi)
    ticks = list(ticks)
    finite = [v for v in data if math.isfinite(v) and (v > 0 or not log)]
    if not ticks or not finite:
        return lo, hi, ticks
    for _ in range(MAX_ADDED_TICKS):
        if ticks[0] <= min(finite):
            break
        below = _neighbour(ticks, after=False, log=log, binary=binary)
        if below is None or not math.isfinite(below) or not below < ticks[0] or (log and below <= 0):
            break
        ticks.insert(0, below)
        lo = min(lo, below)
    for _ in range(MAX_ADDED_TICKS):
        if ticks[-1] >= max(finite):
            break
        above = _neighbour(ticks, after=True, log=log, binary=binary)
        if above is None or not math.isfinite(above) or not above > ticks[-1]:
            break
        ticks.append(above)
        hi = max(hi, above)
    return lo, hi, ticks


def padded_domain(values: Sequence[float], *, log: bool, include_zero: bool = False) -> tuple[float, float]:
    """The interval to plot `values` in, with a margin so that marks do not sit on the frame.

    Any finite values give a finite interval with lo < hi (positive on a log axis), however far apart
    or close together they are: padding is computed in log space, or from halves, so it cannot overflow.
    """
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return (1.0, 10.0) if log else (0.0, 1.0)
    lo, hi = min(finite), max(finite)
    if log:
        log_lo, log_hi = _log10(lo), _log10(hi)
        pad = 0.05 * (log_hi - log_lo) or math.log10(2)
        return _power(10.0, log_lo - pad), _power(10.0, log_hi + pad)
    if include_zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    else:
        pad = hi * 0.06 - lo * 0.06
        lo, hi = (lo if include_zero and lo == 0 else lo - pad), hi + pad
    return max(lo, -sys.float_info.max), min(hi, sys.float_info.max)


def should_use_log(values: Sequence[float], ratio: float = 30.0) -> bool:
    """Log axes when positive values span more than `ratio`: a linear axis would crush the small ones."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return len(positive) >= 2 and max(positive) / min(positive) > ratio


def _axis(title: str, domain: tuple[float, float, Sequence[float]], fmt: Formatter, *,
          log: bool = False) -> dict[str, Any]:
    """A Plotly axis over a `covering_ticks` domain with its ticks and our labels (log axes take their
    range in log10)."""
    lo, hi, ticks = domain
    extent = [_log10(lo), _log10(hi)] if log else [lo, hi]
    if log and not extent[0] < extent[1]:  # denormals all clamp to the smallest normal decade
        extent[1] = extent[0] + 1.0
    return {
        # automargin: plotly.js widens the margin to fit the tick labels and sets the title off them
        # (a fixed margin let "measured peak memory" overlap labels such as "62.5 GiB").
        "title": {"text": _text(title), "standoff": 10}, "automargin": True,
        "type": "log" if log else "linear", "range": extent,
        "tickmode": "array", "tickvals": list(ticks), "ticktext": [_text(fmt(t)) for t in ticks],
        "showgrid": True, "gridcolor": "#e6e8eb", "zeroline": False, "linecolor": "#888888",
        "fixedrange": True,
    }


def _layout(title: str, *, plot_height: int, legend_rows: int, left: int = 70, top: int = 16,
            **extra: Any) -> dict[str, Any]:
    """The layout around a plot area `plot_height` pixels tall: the x axis title under it, then the
    legend in rows at the bottom of the figure (so the two never overlap)."""
    bottom = 56 + 24 * legend_rows
    return {
        "title": {"text": ""}, "meta": {"title": _text(title)}, "height": top + plot_height + bottom,
        "autosize": True, "font": FONT, "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
        "hovermode": "closest", "margin": {"l": left, "r": 20, "t": top, "b": bottom},
        "showlegend": legend_rows > 0,
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 0,
                   "yanchor": "bottom"},
        **extra,
    }


def _trace_meta(css_class: str) -> dict[str, str]:
    return {"class": css_class}


# ---------------------------------------------------------------- chart kinds


def xy_chart(
    *,
    chart_id: str,
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    x_format: Formatter = compact_number,
    y_format: Formatter = compact_number,
    x_log: bool = False,
    x_binary: bool = False,
    y_log: bool = False,
    guides: Sequence[GuideLine] = (),
    plot_height: int = 260,
    y_from_zero: bool = False,
) -> Chart:
    """A scatter / line chart: markers, lines, and reference lines (a vertical limit, or y = x)."""
    # The error bars' ends too, so that no interval is cut off at the plot's edge.
    xs = [x for s in series for p in s.points for x in (p.x, *_ends(p.x_range))]
    ys = [y for s in series for p in s.points for y in (p.y, *_ends(p.y_range))]
    diagonal = any(g.diagonal for g in guides)
    if diagonal:  # one domain for both axes, so that y = x is the true diagonal
        xs = ys = xs + ys
    xs = xs + [g.x for g in guides if g.x is not None]
    x_domain = covering_ticks(*padded_domain(xs, log=x_log), xs, log=x_log, binary=x_binary)
    y_domain = covering_ticks(*padded_domain(ys, log=y_log, include_zero=y_from_zero), ys, log=y_log)
    (x_lo, x_hi, _), (y_lo, y_hi, _) = x_domain, y_domain
    data: list[dict[str, Any]] = []
    for s in series:
        if not s.points:
            continue
        points = sorted(s.points, key=lambda p: p.x) if s.line else list(s.points)
        mode = "+".join(m for m, on in (("lines", s.line and len(points) >= 2), ("markers", s.markers)) if on)
        data.append({
            "type": "scatter", "mode": mode or "markers", "name": _text(s.name),
            "x": [p.x for p in points], "y": [p.y for p in points],
            "hovertext": [_text(p.tooltip) for p in points], "hoverinfo": "text",
            "customdata": [p.href for p in points],
            "marker": _marker(s),
            "line": {"color": s.color, "width": 2},
            "meta": _trace_meta(s.css_class),
            **_error_bars(points, s.color),
        })
    for guide in guides:
        if guide.diagonal:
            lo, hi = max(x_lo, y_lo), min(x_hi, y_hi)
            data.append(_guide_trace(guide.label, [lo, hi], [lo, hi], GUIDE_COLOR))
        elif guide.x is not None:
            data.append(_guide_trace(guide.label, [guide.x, guide.x], [y_lo, y_hi], HIGHLIGHT_COLOR))
    legend = sum(1 for s in series if s.points) + len(guides)
    layout = _layout(
        title, plot_height=plot_height, legend_rows=_legend_rows(legend),
        xaxis=_axis(x_label, x_domain, x_format, log=x_log),
        yaxis=_axis(y_label, y_domain, y_format, log=y_log),
    )
    rows = tuple((_short(s.name), p.tooltip) for s in series for p in s.points)
    return Chart(chart_id, title, {"data": data, "layout": layout}, ("series", "value"), rows)


def _ends(r: Range | None) -> tuple[float, ...]:
    return () if r is None else (r.low, r.high)


def _error_bars(points: Sequence[Point], color: str) -> dict[str, Any]:
    """Plotly's `error_x` / `error_y` for the points' ranges (a point without one gets a bar of zero)."""
    bars: dict[str, Any] = {}
    for axis in ("x", "y"):
        ranges = [getattr(p, f"{axis}_range") for p in points]
        if not any(ranges):
            continue
        values = [getattr(p, axis) for p in points]
        bars[f"error_{axis}"] = {
            "type": "data", "symmetric": False, "color": color, "thickness": 1.2, "width": 3,
            "array": [r.high - v if r else 0.0 for r, v in zip(ranges, values, strict=True)],
            "arrayminus": [v - r.low if r else 0.0 for r, v in zip(ranges, values, strict=True)],
        }
    return bars


def _marker(series: Series) -> dict[str, Any]:
    if series.ring:
        # Open: what lies under it (the same configuration on the Pareto front, an alternative priced
        # the same) stays visible inside the ring.
        return {"color": series.color, "size": 2 * series.radius + 1, "symbol": "circle-open",
                "line": {"color": series.color, "width": 3}}
    return {"color": series.color, "size": 2 * series.radius + 1, "opacity": 0.85,
            "line": {"color": "#ffffff", "width": 1}}


def _guide_trace(label: str, xs: list[float], ys: list[float], color: str) -> dict[str, Any]:
    return {
        "type": "scatter", "mode": "lines", "name": _text(label), "x": xs, "y": ys, "hoverinfo": "skip",
        "line": {"color": color, "width": 1.5, "dash": "dash"}, "meta": _trace_meta("guide"),
    }


def _legend_rows(entries: int, per_row: int = 4) -> int:
    return -(-entries // per_row)


def stacked_bars(
    *,
    chart_id: str,
    title: str,
    bars: Sequence[Bar],
    x_label: str,
    colors: dict[str, str],
    x_format: Formatter = compact_number,
    limit: GuideLine | None = None,
    value_format: Formatter = compact_number,
) -> Chart:
    """Horizontal stacked bars against an optional limit (memory breakdown vs GPU capacity)."""
    labels = [_text(_short(b.label)) for b in bars]
    # Distinct category names even when two labels shorten alike (Plotly would merge the bars).
    labels = [label if labels.count(label) == 1 else f"{label} ({i + 1})" for i, label in enumerate(labels)]
    totals = [sum(v for _, v in b.segments if math.isfinite(v) and v > 0) for b in bars]
    marked = [*totals, *([limit.x] if limit and limit.x is not None else [])]
    hi = max([*marked, 1e-12]) * 1.08
    data: list[dict[str, Any]] = []
    for name, color in colors.items():
        values = [next((v for n, v in b.segments if n == name), 0.0) for b in bars]
        if not any(v > 0 for v in values):
            continue
        data.append({
            "type": "bar", "orientation": "h", "name": _text(name), "y": labels,
            "x": [v if v > 0 else None for v in values],
            "hovertext": [
                _text(f"{b.label} · {name}: {value_format(v)} ({v / t:.0%})") if v > 0 and t > 0 else ""
                for b, v, t in zip(bars, values, totals, strict=True)
            ],
            "hoverinfo": "text", "marker": {"color": color}, "meta": _trace_meta(""),
        })
    data.append({
        "type": "scatter", "mode": "text", "x": totals, "y": labels, "showlegend": False, "hoverinfo": "skip",
        "text": [_text(value_format(t)) for t in totals], "textposition": "middle right",
        "meta": _trace_meta("total"),
    })
    shapes, annotations = [], []
    if limit is not None and limit.x is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": limit.x, "x1": limit.x, "y0": 0,
                       "y1": 1, "line": {"color": HIGHLIGHT_COLOR, "width": 2, "dash": "dash"}})
        annotations.append({"xref": "x", "yref": "paper", "x": limit.x, "y": 1, "yanchor": "bottom",
                            "xanchor": "right", "text": _text(limit.label), "showarrow": False,
                            "font": {"color": HIGHLIGHT_COLOR}})
    layout = _layout(
        title, plot_height=20 + 36 * len(bars), legend_rows=_legend_rows(len(data) - 1), left=10,
        top=26 if limit else 12, barmode="stack", shapes=shapes, annotations=annotations,
        xaxis=_axis(x_label, covering_ticks(0.0, hi, marked), x_format),
        yaxis={"type": "category", "autorange": "reversed", "automargin": True, "fixedrange": True},
    )
    rows = tuple((b.label, name, value_format(v)) for b in bars for name, v in b.segments if v > 0)
    return Chart(chart_id, title, {"data": data, "layout": layout}, ("bar", "part", "value"), rows)


def timeline(
    *,
    chart_id: str,
    title: str,
    lanes: Sequence[str],
    spans: Sequence[Span],
    legend: Sequence[tuple[str, str]],
    x_label: str = "time in the step",
) -> Chart:
    """A Gantt-style chart: one row per lane, one bar per span (grouped into a trace per colour)."""
    end = max((s.end for s in spans if math.isfinite(s.end)), default=1.0) or 1.0
    names = {color: name for name, color in legend}
    groups: dict[tuple[str, str], list[Span]] = {}
    for span in spans:
        groups.setdefault((span.color, span.css_class), []).append(span)
    data: list[dict[str, Any]] = []
    shown: set[str] = set()
    for (color, css_class), members in groups.items():
        name = names.get(color, css_class or "span")
        data.append({
            "type": "bar", "orientation": "h", "name": _text(name), "legendgroup": _text(name),
            "showlegend": name not in shown,
            "y": [_text(s.lane) for s in members], "base": [s.start for s in members],
            # A summed phase block stands for a whole part of the step: never thinner than one can point
            # at (single spans may be slivers: there are hundreds of them).
            "x": [max(s.end - s.start, end * (0.006 if "phase" in css_class.split() else 0.001))
                  for s in members],
            "hovertext": [_text(s.tooltip) for s in members], "hoverinfo": "text",
            "text": [_text(_span_label(s, end)) for s in members], "textposition": "inside",
            "insidetextanchor": "start", "textfont": {"color": ink_on(color)},
            "marker": {"color": color, "line": {"width": 0}}, "width": 0.7,
            "meta": _trace_meta(css_class),
        })
        shown.add(name)
    layout = _layout(
        title, plot_height=20 + 46 * len(lanes), legend_rows=_legend_rows(len(shown)), left=10, top=12,
        barmode="overlay",
        uniformtext={"mode": "hide", "minsize": 10},
        # The axis is the step: it ends where the step does, with no tick beyond it.
        xaxis=_axis(x_label, covering_ticks(0.0, end, ()), duration),
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": [_text(lane) for lane in lanes],
               "autorange": "reversed", "automargin": True, "fixedrange": True},
    )
    rows = tuple((s.lane, s.tooltip) for s in spans)
    return Chart(chart_id, title, {"data": data, "layout": layout}, ("lane", "span"), rows)


def _span_label(span: Span, end: float, plot_px: float = 620.0) -> str:
    """The span's label if it fits its width at 12 px text, else the short one, else nothing."""
    width = (span.end - span.start) / end * plot_px if end > 0 else 0.0
    return next((t for t in (span.label, span.short_label) if t and width >= 12 * 0.62 * len(t) + 8), "")


def ink_on(fill: str) -> str:
    """Dark or white text, whichever reads on a `#rrggbb` fill (by its relative luminance)."""
    red, green, blue = (int(fill[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#111111" if 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.45 else "#ffffff"


def _bin_edges(lo: float, hi: float, bins: int) -> list[float]:
    """About `bins` bins of a nice width covering [lo, hi]; one bin when the values are too close
    together (relative to their size) or too far apart for floats to hold distinct nice edges."""
    width = nice_step(hi / 2 - lo / 2, bins / 2)
    start = math.floor(lo / width) * width if math.isfinite(lo / width) else lo
    count = math.ceil((hi / 2 - start / 2) / width * 2) if math.isfinite(start) else 1
    edges = [start + i * width for i in range(max(1, min(count, 4 * bins)) + 1)]
    if all(math.isfinite(e) for e in edges) and all(a < b for a, b in itertools.pairwise(edges)) and (
        edges[0] <= lo and edges[-1] >= hi
    ):
        return edges
    return [lo, hi]


def histogram(
    *,
    chart_id: str,
    title: str,
    series: Sequence[tuple[str, Sequence[float], str]],
    x_label: str,
    x_format: Formatter = compact_number,
    bins: int = 12,
) -> Chart:
    """Counts of values per bin, one colour per series, bins shared by all series (side by side)."""
    values = [v for _, vs, _ in series for v in vs if math.isfinite(v)]
    if not values:
        lo, hi = 0.0, 1.0
    elif min(values) == max(values):
        lo, hi = padded_domain(values, log=False)
    else:
        lo, hi = min(values), max(values)
    edges = _bin_edges(lo, hi, bins)
    lo, hi = edges[0], edges[-1]
    bin_edges = list(itertools.pairwise(edges))
    visible = [s for s in series if s[1]]
    data: list[dict[str, Any]] = []
    rows: list[tuple[str, ...]] = []
    highest = 1
    for slot, (name, vs, color) in enumerate(visible):
        # Half-open bins, except the last, which also takes the maximum.
        counts = [sum(1 for v in vs if a <= v < b or (b == edges[-1] and v == b)) for a, b in bin_edges]
        highest = max(highest, *counts)
        share = 1 / len(visible)
        data.append({
            "type": "bar", "name": _text(name),
            "x": [a + (slot + 0.5) * share * (b - a) for a, b in bin_edges],
            "y": [c or None for c in counts], "width": [share * (b - a) * 0.9 for a, b in bin_edges],
            "hovertext": [_text(f"{name}: {c} run(s) in [{x_format(a)}, {x_format(b)})")
                          for (a, b), c in zip(bin_edges, counts, strict=True)],
            "hoverinfo": "text", "marker": {"color": color}, "meta": _trace_meta(""),
        })
        rows.extend((name, f"[{x_format(a)}, {x_format(b)})", str(c))
                    for (a, b), c in zip(bin_edges, counts, strict=True) if c)
    if lo < 0 < hi:
        data.append(_guide_trace("zero error", [0.0, 0.0], [0.0, highest * 1.1], GUIDE_COLOR))
    layout = _layout(
        title, plot_height=220, legend_rows=_legend_rows(len(visible)), barmode="overlay",
        xaxis=_axis(x_label, covering_ticks(lo, hi, values), x_format),
        yaxis=_axis("runs", covering_ticks(0.0, highest * 1.1, [highest],
                                           ticks=[t for t in nice_ticks(0.0, highest * 1.1) if t == int(t)]),
                    lambda v: f"{v:g}" if v == int(v) else ""),
    )
    return Chart(chart_id, title, {"data": data, "layout": layout}, ("series", "bin", "runs"), tuple(rows))
