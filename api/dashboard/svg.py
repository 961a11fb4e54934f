"""Server-rendered SVG charts: scales, ticks, and the four chart kinds the dashboard draws.

Charts are computed here and inlined in the HTML, so they exist without JavaScript, need no vendored
library (nothing to pin or license), and tests can count their marks. Every data mark carries the
class `mark` and a `<title>` (the browser's native tooltip); axes and grid lines are `<line>`s, so a
chart with no data has no `.mark` at all. All text is escaped here: labels may come from user input.

Only SVG presentation attributes are used (no `style=`), so the dashboard's Content-Security-Policy
can forbid inline styles.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from api.dashboard.formatting import compact_number, duration

# A qualitative palette that stays distinguishable for common colour-vision deficiencies (Okabe-Ito).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#999999")
EXPOSED_COLOR = "#d62728"
HIGHLIGHT_COLOR = "#d62728"
WIDTH = 720
LEGEND_OFFSET = 60
"""Distance from the x axis down to the first legend row."""
FONT = 12

Formatter = Callable[[float], str]


def _attrs(**attributes: object) -> str:
    """`key="value"` pairs, escaped; underscores in names become dashes (stroke_width -> stroke-width)."""
    parts = []
    for name, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.2f}".rstrip("0").rstrip(".")
        parts.append(f'{name.rstrip("_").replace("_", "-")}="{escape(str(value))}"')
    return " ".join(parts)


def _element(tag: str, tooltip: str | None = None, **attributes: object) -> str:
    if tooltip is None:
        return f"<{tag} {_attrs(**attributes)}/>"
    return f"<{tag} {_attrs(**attributes)}><title>{escape(tooltip)}</title></{tag}>"


def _text(x: float, y: float, content: str, **attributes: object) -> str:
    attributes.setdefault("font_size", FONT)
    return f"<text {_attrs(x=x, y=y, **attributes)}>{escape(content)}</text>"


@dataclass(frozen=True)
class Scale:
    """Maps a data interval onto a pixel interval, linearly or logarithmically."""

    lo: float
    hi: float
    out_lo: float
    out_hi: float
    log: bool = False
    binary: bool = False
    """Log ticks at powers of two (byte sizes: 1 KiB, 16 KiB, ...) instead of powers of ten."""

    def __call__(self, value: float) -> float:
        lo, hi, v = self.lo, self.hi, value
        if self.log:
            lo, hi, v = _log10(lo), _log10(hi), _log10(value if value > 0 else self.lo)
        if not math.isfinite(v):
            v = hi if v > 0 else lo
        # Halve first: hi - lo of two large floats of opposite sign overflows, their halves do not.
        span = hi / 2 - lo / 2
        fraction = (v / 2 - lo / 2) / span if 0 < span < math.inf else 0.5
        fraction = 0.5 if math.isnan(fraction) else min(max(fraction, -1.0), 2.0)
        return self.out_lo + fraction * (self.out_hi - self.out_lo)

    def ticks(self, count: int = 5) -> list[float]:
        if self.log:
            return binary_ticks(self.lo, self.hi) if self.binary else log_ticks(self.lo, self.hi)
        return nice_ticks(self.lo, self.hi, count)


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


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    tooltip: str


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
    """Extra classes on the series' marks (e.g. `chosen`), for styling and tests."""


@dataclass(frozen=True)
class GuideLine:
    """A labelled reference: vertical at `x` (e.g. GPU capacity) or the y = x diagonal."""

    label: str
    x: float | None = None
    diagonal: bool = False


@dataclass
class _Frame:
    """The plot area inside a chart's margins."""

    height: int
    left: int = 64
    right: int = 16
    top: int = 16
    bottom: int = 44
    parts: list[str] = field(default_factory=list)

    @property
    def x0(self) -> int:
        return self.left

    @property
    def x1(self) -> int:
        return WIDTH - self.right

    @property
    def y0(self) -> int:
        return self.height - self.bottom

    @property
    def y1(self) -> int:
        return self.top


def _svg(chart_id: str, title: str, height: int, parts: list[str]) -> Markup:
    title_id = f"{chart_id}-title"
    return Markup(
        f'<svg class="chart-svg" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-labelledby="{escape(title_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'font-family="system-ui, sans-serif">'
        f'<title id="{escape(title_id)}">{escape(title)}</title>' + "".join(parts) + "</svg>"
    )


def _x_axis(frame: _Frame, scale: Scale, label: str, fmt: Formatter) -> None:
    for tick in scale.ticks():
        x = scale(tick)
        frame.parts.append(_element("line", x1=x, x2=x, y1=frame.y1, y2=frame.y0, stroke="#e3e3e3"))
        frame.parts.append(_text(x, frame.y0 + 16, fmt(tick), text_anchor="middle", fill="#444"))
    frame.parts.append(_element("line", x1=frame.x0, x2=frame.x1, y1=frame.y0, y2=frame.y0, stroke="#888"))
    frame.parts.append(
        _text((frame.x0 + frame.x1) / 2, frame.y0 + 36, label, text_anchor="middle", fill="#222")
    )


def _y_axis(frame: _Frame, scale: Scale, label: str, fmt: Formatter) -> None:
    for tick in scale.ticks():
        y = scale(tick)
        frame.parts.append(_element("line", x1=frame.x0, x2=frame.x1, y1=y, y2=y, stroke="#e3e3e3"))
        frame.parts.append(_text(frame.x0 - 6, y + 4, fmt(tick), text_anchor="end", fill="#444"))
    frame.parts.append(_element("line", x1=frame.x0, x2=frame.x0, y1=frame.y1, y2=frame.y0, stroke="#888"))
    mid = (frame.y0 + frame.y1) / 2
    frame.parts.append(
        _text(14, mid, label, text_anchor="middle", fill="#222", transform=f"rotate(-90 14 {mid:.1f})")
    )


def _legend(entries: Sequence[tuple[str, str]], y: float) -> list[str]:
    """One row of colour swatches and names (wraps onto further rows when long)."""
    parts, x, row = [], 64.0, 0
    for name, color in entries:
        width = 28 + 7.6 * len(name)
        if x + width > WIDTH - 8 and x > 64:
            x, row = 64.0, row + 1
        top = y + row * 18
        parts.append(_element("rect", x=x, y=top - 9, width=12, height=12, fill=color, rx=2))
        parts.append(_text(x + 16, top + 1, name, fill="#222"))
        x += width
    return parts


def _bottom(legend: Sequence[tuple[str, str]]) -> int:
    """Room under the plot for tick labels, the axis label and the legend rows."""
    return LEGEND_OFFSET + 8 + 18 * legend_rows(legend)


def legend_rows(entries: Sequence[tuple[str, str]]) -> int:
    x, rows = 64.0, 1
    for name, _ in entries:
        width = 28 + 7.6 * len(name)
        if x + width > WIDTH - 8 and x > 64:
            x, rows = 64.0, rows + 1
        x += width
    return rows


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
) -> Markup:
    """A scatter / line chart: markers, lines, and reference lines (a vertical limit, or y = x)."""
    xs = [p.x for s in series for p in s.points]
    ys = [p.y for s in series for p in s.points]
    diagonal = any(g.diagonal for g in guides)
    if diagonal:  # one domain for both axes, so that y = x is the true diagonal
        xs = ys = xs + ys
    xs = xs + [g.x for g in guides if g.x is not None]
    legend = [(s.name, s.color) for s in series if s.points]
    frame = _Frame(height=0, bottom=_bottom(legend))
    frame.height = frame.top + plot_height + frame.bottom
    y_scale = Scale(*padded_domain(ys, log=y_log, include_zero=y_from_zero), frame.y0, frame.y1, log=y_log)
    # Room for the longest y tick label beside the rotated axis title.
    frame.left = max(frame.left, 34 + 7 * max((len(y_format(t)) for t in y_scale.ticks()), default=0))
    x_scale = Scale(*padded_domain(xs, log=x_log), frame.x0, frame.x1, log=x_log, binary=x_binary)
    _x_axis(frame, x_scale, x_label, x_format)
    _y_axis(frame, y_scale, y_label, y_format)
    for guide in guides:
        if guide.diagonal:
            lo, hi = max(x_scale.lo, y_scale.lo), min(x_scale.hi, y_scale.hi)
            frame.parts.append(_element(
                "line", x1=x_scale(lo), y1=y_scale(lo), x2=x_scale(hi), y2=y_scale(hi),
                stroke="#555", stroke_dasharray="5 4", class_="guide",
            ))
            frame.parts.append(_text(x_scale(hi) - 4, y_scale(hi) + 14, guide.label, text_anchor="end",
                                     fill="#555"))
        elif guide.x is not None:
            x = x_scale(guide.x)
            frame.parts.append(_element("line", x1=x, x2=x, y1=frame.y1, y2=frame.y0, stroke=HIGHLIGHT_COLOR,
                                        stroke_dasharray="6 4", class_="guide"))
            frame.parts.append(_text(x - 4, frame.y1 + 12, guide.label, text_anchor="end",
                                     fill=HIGHLIGHT_COLOR))
    for s in series:
        classes = f"mark {s.css_class}".strip()
        if s.line and len(s.points) >= 2:
            ordered = sorted(s.points, key=lambda p: p.x)
            path = "M" + " L".join(f"{x_scale(p.x):.1f},{y_scale(p.y):.1f}" for p in ordered)
            frame.parts.append(_element("path", tooltip=s.name, d=path, fill="none", stroke=s.color,
                                        stroke_width=2, class_=classes))
        if s.markers:
            for p in s.points:
                frame.parts.append(_element(
                    "circle", tooltip=p.tooltip, cx=x_scale(p.x), cy=y_scale(p.y), r=s.radius, fill=s.color,
                    fill_opacity=0.85, stroke="#fff", stroke_width=1, class_=classes,
                ))
    frame.parts.extend(_legend(legend, frame.y0 + LEGEND_OFFSET))
    return _svg(chart_id, title, frame.height, frame.parts)


@dataclass(frozen=True)
class Bar:
    """One horizontal bar made of named segments stacked left to right."""

    label: str
    segments: Sequence[tuple[str, float]]
    href: str | None = None


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
) -> Markup:
    """Horizontal stacked bars against an optional limit (memory breakdown vs GPU capacity)."""
    legend = [(name, color) for name, color in colors.items()]
    label_width = min(230, 24 + 7 * max((len(b.label) for b in bars), default=0))
    max_chars = int((label_width - 16) / 7.5)  # at FONT 12, an average character is about 7 units wide
    height = 16 + 34 * len(bars) + _bottom(legend) + (14 if limit else 0)
    frame = _Frame(height=height, left=label_width, top=16 + (14 if limit else 0),
                   bottom=_bottom(legend))
    totals = [sum(v for _, v in b.segments) for b in bars]
    hi = max([*totals, limit.x if limit and limit.x is not None else 0.0, 1e-12])
    scale = Scale(0.0, hi * 1.04, frame.x0, frame.x1)
    _x_axis(frame, scale, x_label, x_format)
    for row, (bar, total) in enumerate(zip(bars, totals, strict=True)):
        y = frame.y1 + 8 + 34 * row
        label = bar.label if len(bar.label) <= max_chars else bar.label[: max_chars - 1] + "…"
        frame.parts.append(_text(frame.x0 - 8, y + 15, label, text_anchor="end", fill="#222"))
        x = 0.0
        for name, value in bar.segments:
            if value <= 0:
                continue
            share = f"{value / total:.0%}" if total > 0 else ""
            frame.parts.append(_element(
                "rect", tooltip=f"{bar.label} · {name}: {value_format(value)} ({share})",
                x=scale(x), y=y, width=max(scale(x + value) - scale(x), 0.75), height=22,
                fill=colors.get(name, "#999"), class_="mark",
            ))
            x += value
        frame.parts.append(_text(scale(total) + 4, y + 15, value_format(total), fill="#222"))
    if limit is not None and limit.x is not None:
        x = scale(limit.x)
        frame.parts.append(_element("line", x1=x, x2=x, y1=frame.y1 - 4, y2=frame.y0, stroke=HIGHLIGHT_COLOR,
                                    stroke_width=2, stroke_dasharray="6 4", class_="guide"))
        frame.parts.append(_text(x, frame.y1 - 8, limit.label, text_anchor="end", fill=HIGHLIGHT_COLOR))
    frame.parts.extend(_legend(legend, frame.y0 + LEGEND_OFFSET))
    return _svg(chart_id, title, frame.height, frame.parts)


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


def timeline(
    *,
    chart_id: str,
    title: str,
    lanes: Sequence[str],
    spans: Sequence[Span],
    legend: Sequence[tuple[str, str]],
    x_label: str = "time in the step",
) -> Markup:
    """A Gantt-style chart: one row per lane, one rect per span."""
    frame = _Frame(height=0, left=112)
    frame.bottom = _bottom(legend)
    frame.height = frame.top + 40 * len(lanes) + frame.bottom
    end = max((s.end for s in spans), default=1.0) or 1.0
    scale = Scale(0.0, end, frame.x0, frame.x1)
    _x_axis(frame, scale, x_label, duration)
    for row, lane in enumerate(lanes):
        y = frame.y1 + 8 + 40 * row
        frame.parts.append(_text(frame.x0 - 8, y + 17, lane, text_anchor="end", fill="#222"))
        for span in (s for s in spans if s.lane == lane):
            # A summed phase block stands for a whole part of the step: never thinner than a line
            # one can point at (single spans may be slivers: there are hundreds of them).
            least = 4.0 if "phase" in span.css_class.split() else 0.75
            width = max(scale(span.end) - scale(span.start), least)
            frame.parts.append(_element(
                "rect", tooltip=span.tooltip, x=scale(span.start), y=y,
                width=width, height=26, fill=span.color,
                class_=f"mark {span.css_class}".strip(),
            ))
            label = next((text for text in (span.label, span.short_label)
                          if text and width >= FONT * 0.62 * len(text) + 8), None)
            if label:
                frame.parts.append(_text(scale(span.start) + 4, y + 17, label,
                                         fill=_ink_on(span.color), class_="span-label"))
    frame.parts.extend(_legend(legend, frame.y0 + LEGEND_OFFSET))
    return _svg(chart_id, title, frame.height, frame.parts)


def _ink_on(fill: str) -> str:
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
) -> Markup:
    """Counts of values per bin, one colour per series, bins shared by all series (side by side)."""
    values = [v for _, vs, _ in series for v in vs if math.isfinite(v)]
    legend = [(name, color) for name, vs, color in series if vs]
    frame = _Frame(height=0, bottom=_bottom(legend))
    frame.height = frame.top + 220 + frame.bottom
    if not values:
        lo, hi = 0.0, 1.0
    elif min(values) == max(values):
        lo, hi = padded_domain(values, log=False)
    else:
        lo, hi = min(values), max(values)
    edges = _bin_edges(lo, hi, bins)
    lo, hi = edges[0], edges[-1]
    bin_edges = list(itertools.pairwise(edges))
    # Half-open bins, except the last, which also takes the maximum.
    counts = [
        [sum(1 for v in vs if a <= v < b or (b == edges[-1] and v == b)) for a, b in bin_edges]
        for _, vs, _ in series
    ]
    x_scale = Scale(lo, hi, frame.x0, frame.x1)
    y_scale = Scale(0.0, max([c for row in counts for c in row] + [1]) * 1.1, frame.y0, frame.y1)
    _x_axis(frame, x_scale, x_label, x_format)
    _y_axis(frame, y_scale, "runs", lambda v: f"{v:g}" if v == int(v) else "")
    visible = [(i, s) for i, s in enumerate(series) if s[1]]
    for slot, (index, (name, _, color)) in enumerate(visible):
        for (a, b), count in zip(bin_edges, counts[index], strict=True):
            if count == 0:
                continue
            bin_width = (x_scale(b) - x_scale(a)) / len(visible)
            x = x_scale(a) + slot * bin_width
            frame.parts.append(_element(
                "rect", tooltip=f"{name}: {count} run(s) in [{x_format(a)}, {x_format(b)})",
                x=x + 1, y=y_scale(count), width=max(bin_width - 2, 1.0), height=frame.y0 - y_scale(count),
                fill=color, class_="mark",
            ))
    if lo < 0 < hi:
        x = x_scale(0.0)
        frame.parts.append(_element("line", x1=x, x2=x, y1=frame.y1, y2=frame.y0, stroke="#555",
                                    stroke_dasharray="5 4", class_="guide"))
    frame.parts.extend(_legend(legend, frame.y0 + LEGEND_OFFSET))
    return _svg(chart_id, title, frame.height, frame.parts)
