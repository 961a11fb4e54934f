"""Reading the dashboard's charts back out of a page: the Plotly figure each `<figure>` carries as a
JSON data island, and counts of what it draws (the tests' view of api/dashboard/charts.py)."""

from __future__ import annotations

import json
import re
from typing import Any


def figure_html(html: str, chart: str) -> str:
    """The markup of one chart's `<figure>` (its island, caption and data table)."""
    match = re.search(rf'<figure class="chart" data-chart="{chart}">(.*?)</figure>', html, re.S)
    assert match, f"no {chart} chart on the page"
    return match.group(1)


def plot(html: str, chart: str) -> dict[str, Any]:
    """The Plotly figure of one chart (`{"data": [...], "layout": {...}}`)."""
    island = re.search(r'<script type="application/json" class="plot-figure"[^>]*>(.*?)</script>',
                       figure_html(html, chart), re.S)
    assert island, f"the {chart} chart has no figure"
    return json.loads(island.group(1))


def traces(figure: dict[str, Any], css_class: str | None = None) -> list[dict[str, Any]]:
    """The figure's traces, or those whose `meta.class` includes `css_class`."""
    return [t for t in figure["data"]
            if css_class is None or css_class in (t.get("meta") or {}).get("class", "").split()]


def marks(html: str, chart: str, kind: str = "", css_class: str | None = None) -> int:
    """What a chart draws: `circle` markers, `path` lines (one per line trace), `rect` bars (one per
    drawn value); all of them when `kind` is empty. Guides (reference lines) are not marks."""
    count = 0
    for trace in traces(plot(html, chart), css_class):
        if "guide" in (trace.get("meta") or {}).get("class", "").split():
            continue
        mode = trace.get("mode", "")
        if trace["type"] == "scatter" and "markers" in mode and kind in ("", "circle"):
            count += sum(1 for y in trace["y"] if y is not None)
        if trace["type"] == "scatter" and "lines" in mode and kind in ("", "path"):
            count += 1
        if trace["type"] == "bar" and kind in ("", "rect"):
            drawn = zip(trace["x"], trace["y"], strict=True)
            count += sum(1 for x, y in drawn if x is not None and y is not None)
    return count
