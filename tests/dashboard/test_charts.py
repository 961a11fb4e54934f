"""The Plotly figures (api/dashboard/charts.py): ticks, escaping, JSON safety for any numbers, marks that
match the data, and the plotly.js assets served from the installed package."""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from api.dashboard import charts
from api.dashboard.formatting import binary_bytes, compact_number
from api.dashboard.vendor import PLOTLY_CSS_URL, PLOTLY_JS_URL, plotly_style_guard_ids
from planner.formatting import duration

FLOATS = st.floats(allow_nan=False, allow_infinity=False)
POSITIVE = st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False)
EXTREMES = [5e-324, sys.float_info.min, 1e-300, 1e-9, 0.0, 1.0, 1.0 + 2**-52, 1e20, 1e20 + 16384, 1e300,
            sys.float_info.max]


def parsed(chart: charts.Chart) -> dict[str, Any]:
    """The island as a browser reads it: strict JSON (no NaN / Infinity), back to the figure."""
    text = str(chart.island())
    assert "<" not in text and ">" not in text and "&" not in text.replace("\\u0026", "")
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the figure"))


def numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    items = value.values() if isinstance(value, dict) else value
    return [n for item in items for n in numbers(item)]


def assert_drawable(chart: charts.Chart) -> dict[str, Any]:
    figure = parsed(chart)
    assert all(math.isfinite(n) for n in numbers(figure))
    for axis in ("xaxis", "yaxis"):
        layout_axis = figure["layout"].get(axis, {})
        if "range" in layout_axis:
            lo, hi = layout_axis["range"]
            assert lo is not None and hi is not None and lo < hi, layout_axis
    return figure


def xy(values: list[tuple[float, float]], *, log: bool, diagonal: bool = False) -> charts.Chart:
    points = [charts.Point(x, y, "p") for x, y in values]
    return charts.xy_chart(
        chart_id="c", title="t", x_label="x", y_label="y", series=[charts.Series("s", points, "#000000")],
        x_log=log, y_log=log, guides=[charts.GuideLine("y = x", diagonal=True)] if diagonal else [],
    )


def test_ticks_are_round_numbers_inside_the_domain() -> None:
    assert charts.nice_ticks(0, 97) == [0, 20, 40, 60, 80]
    assert charts.nice_ticks(0.0013, 0.0061) == [0.002, 0.003, 0.004, 0.005, 0.006]
    assert charts.log_ticks(3e6, 2e12)[:3] == [1e7, 1e8, 1e9]
    assert charts.log_ticks(15, 800) == [20, 50, 100, 200, 500]
    assert [binary_bytes(t) for t in charts.binary_ticks(900, 1.2 * 2**30)] == [
        "1 KiB", "16 KiB", "256 KiB", "4 MiB", "64 MiB", "1 GiB"
    ]


def tick_range(figure: dict[str, Any], axis: str) -> tuple[float, float]:
    ticks = figure["layout"][axis]["tickvals"]
    return min(ticks), max(ticks)


def test_the_ticks_reach_past_the_data() -> None:
    """A study's costs of $20.7M-$30.4M were ticked $25M, $30M, its Pareto front under the first tick;
    its days, 46-3157 on a log axis, from 50 (issue 24, item 7)."""
    figure = parsed(xy([(46.2, 20.75e6), (3157.0, 30.44e6), (120.0, 22.5e6)], log=False))
    assert tick_range(figure, "yaxis")[0] <= 20.75e6 and tick_range(figure, "yaxis")[1] >= 30.44e6
    assert figure["layout"]["yaxis"]["tickvals"] == [20e6, 25e6, 30e6, 35e6]
    assert figure["layout"]["yaxis"]["range"][0] <= 20e6  # the added tick is inside the plotted range
    logged = parsed(xy([(46.2, 20.75e6), (3157.0, 30.44e6)], log=True))
    assert tick_range(logged, "xaxis") == (20.0, 5000.0)
    assert logged["layout"]["xaxis"]["range"][0] <= math.log10(20.0)


def covered(values: list[float], figure: dict[str, Any], axis: str) -> bool:
    low, high = tick_range(figure, axis)
    return low <= min(values) and high >= max(values)


@settings(max_examples=150, deadline=2000, derandomize=True, database=None)
@given(st.lists(st.floats(min_value=-1e15, max_value=1e15), min_size=2, max_size=6),
       st.lists(st.floats(min_value=1e-12, max_value=1e15), min_size=2, max_size=6))
def test_ticks_cover_every_value_on_linear_and_log_axes(linear: list[float], positive: list[float]) -> None:
    for values, log in ((linear, False), (positive, True)):
        figure = parsed(xy([(v, v) for v in values], log=log))
        assert covered(values, figure, "xaxis") and covered(values, figure, "yaxis"), values
        extent = figure["layout"]["yaxis"]["range"]
        low, high = tick_range(figure, "yaxis")
        low, high = (math.log10(low), math.log10(high)) if log else (low, high)
        slack = 1e-9 * (abs(low) + abs(high) + 1)
        assert extent[0] <= low + slack and extent[1] >= high - slack  # every tick is drawn


def test_axes_carry_our_ticks_and_labels() -> None:
    chart = charts.xy_chart(
        chart_id="c", title="t", x_label="bytes", y_label="time", x_log=True, x_binary=True,
        x_format=binary_bytes, y_format=duration,
        series=[charts.Series("s", [charts.Point(1024, 0.002, "a"), charts.Point(2**30, 0.5, "b")],
                              "#000000")],
    )
    layout = parsed(chart)["layout"]
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "linear"
    assert layout["xaxis"]["ticktext"][:2] == ["1 KiB", "16 KiB"]
    assert layout["xaxis"]["range"][0] < math.log10(1024) < math.log10(2**30) < layout["xaxis"]["range"][1]
    assert all(text.endswith(("ms", " s")) or text == "0 µs" for text in layout["yaxis"]["ticktext"])
    assert compact_number(1234) == "1.23k" and duration(0.0055) == "5.5 ms"


def test_text_is_escaped_everywhere_and_cannot_close_the_script() -> None:
    hostile = '</script><script>alert("x")</script> & co'
    chart = charts.xy_chart(
        chart_id="c", title=hostile, x_label=hostile, y_label="y",
        series=[charts.Series(hostile, [charts.Point(1, 2, hostile)], "#000000")],
    )
    island = str(chart.island())
    assert "</script>" not in island and "<" not in island
    figure = parsed(chart)
    trace = figure["data"][0]
    escaped = "&lt;/script&gt;&lt;script&gt;alert(\"x\")&lt;/script&gt; &amp; co"
    assert trace["name"] == trace["hovertext"][0] == escaped
    assert figure["layout"]["xaxis"]["title"]["text"].startswith("&lt;/script&gt;")
    bars = charts.stacked_bars(chart_id="b", title="t", bars=[charts.Bar(hostile, [("a&b", 1.0)])],
                               x_label="x", colors={"a&b": "#000000"})
    assert "<script>" not in str(bars.island()) and parsed(bars)["data"][0]["name"] == "a&amp;b"
    # The data table under the chart keeps the raw text: Jinja escapes it on the page.
    assert chart.rows[0][1] == hostile


def test_marks_match_the_data() -> None:
    empty = charts.xy_chart(chart_id="e", title="t", x_label="x", y_label="y", series=[])
    assert parsed(empty)["data"] == []
    points = [charts.Point(i, i * i, f"p{i}", href=f"/plans/{i}") for i in range(1, 6)]
    line = parsed(charts.xy_chart(chart_id="c", title="t", x_label="x", y_label="y",
                                  series=[charts.Series("s", points[::-1], "#000000", line=True,
                                                        css_class="pareto")]))
    (trace,) = line["data"]
    assert trace["mode"] == "lines+markers" and trace["x"] == [1, 2, 3, 4, 5]  # a line is drawn in x order
    assert trace["customdata"] == [f"/plans/{i}" for i in range(1, 6)] and trace["meta"]["class"] == "pareto"

    values = [-12.0, -3.5, 0.0, 0.1, 4.0, 4.0, 19.9]
    histogram = parsed(charts.histogram(chart_id="h", title="t", series=[("err", values, "#000000")],
                                        x_label="x"))
    bars = histogram["data"][0]
    assert sum(y for y in bars["y"] if y) == len(values)  # every value in exactly one bin, the maximum too
    assert histogram["data"][-1]["meta"]["class"] == "guide"  # zero, between the errors

    timeline = parsed(charts.timeline(chart_id="t", title="t", lanes=["a", "b"], legend=[],
                                      spans=[charts.Span("a", 0, 1, "#000000", "x"),
                                             charts.Span("b", 1, 3, "#000000", "y", css_class="exposed")]))
    widths = [w for trace in timeline["data"] for w in trace["x"]]
    bases = [b for trace in timeline["data"] for b in trace["base"]]
    assert widths == [1, 2] and bases == [0, 1]  # bars as long as the spans, where they start
    assert [t["meta"]["class"] for t in timeline["data"]] == ["", "exposed"]


def test_stacked_bars_leave_out_empty_parts_and_mark_the_limit() -> None:
    chart = charts.stacked_bars(
        chart_id="m", title="t", x_label="GiB",
        colors={"params": "#111111", "grads": "#222222", "zero": "#333333"},
        bars=[charts.Bar("plan a", [("params", 3.0), ("grads", 1.0), ("zero", 0.0)]),
              charts.Bar("plan b", [("params", 2.0), ("grads", 0.0)])],
        limit=charts.GuideLine("GPU capacity 8 GiB", x=8.0),
    )
    figure = parsed(chart)
    parts = {t["name"]: t["x"] for t in figure["data"] if t["type"] == "bar"}
    assert parts == {"params": [3.0, 2.0], "grads": [1.0, None]}
    assert figure["layout"]["shapes"][0]["x0"] == 8.0
    assert figure["layout"]["annotations"][0]["text"] == "GPU capacity 8 GiB"
    assert ("plan a", "params", "3") in chart.rows and len(chart.rows) == 3


@settings(max_examples=120, deadline=2000, derandomize=True, database=None)
@given(st.lists(st.tuples(FLOATS, FLOATS), min_size=1, max_size=6))
def test_linear_charts_draw_any_finite_values(values: list[tuple[float, float]]) -> None:
    assert_drawable(xy(values, log=False))


@settings(max_examples=120, deadline=2000, derandomize=True, database=None)
@given(st.lists(st.tuples(POSITIVE, POSITIVE), min_size=1, max_size=6), st.booleans())
def test_log_charts_draw_any_positive_values(values: list[tuple[float, float]], diagonal: bool) -> None:
    assert_drawable(xy(values, log=True, diagonal=diagonal))


@settings(max_examples=120, deadline=2000, derandomize=True, database=None)
@given(st.lists(FLOATS, min_size=0, max_size=8), st.lists(FLOATS, max_size=4))
def test_histograms_count_every_finite_value(first: list[float], second: list[float]) -> None:
    chart = charts.histogram(chart_id="h", title="t", x_label="x",
                             series=[("a", first, "#000000"), ("b", second, "#111111")])
    figure = assert_drawable(chart)
    for name, values in (("a", first), ("b", second)):
        counted = sum(y or 0 for t in figure["data"] if t["name"] == name for y in t["y"])
        assert counted == len(values)


def test_non_finite_values_become_gaps_not_broken_json() -> None:
    chart = charts.xy_chart(chart_id="c", title="t", x_label="x", y_label="y", series=[
        charts.Series("s", [charts.Point(math.nan, 1.0, "a"), charts.Point(1.0, math.inf, "b"),
                            charts.Point(2.0, 3.0, "c")], "#000000")])
    trace = assert_drawable(chart)["data"][0]
    assert trace["x"] == [None, 1.0, 2.0] and trace["y"] == [1.0, None, 3.0]


@pytest.mark.parametrize("value", EXTREMES)
def test_degenerate_data_one_value_or_all_equal(value: float) -> None:
    for count in (1, 3):
        assert_drawable(xy([(value, value)] * count, log=False))
        if value > 0:
            assert_drawable(xy([(value, value)] * count, log=True, diagonal=True))
    assert_drawable(charts.histogram(chart_id="h", title="t", series=[("a", [value] * 3, "#000000")],
                                     x_label="x"))


def test_ticks_of_extreme_domains_are_finite_and_few() -> None:
    for lo, hi in [(5e-324, 1e-300), (1e-300, sys.float_info.max), (1e20, 1e20 + 16384),
                   (-sys.float_info.max, sys.float_info.max), (0.0, 5e-324)]:
        for ticks in (charts.nice_ticks(lo, hi), charts.log_ticks(max(lo, 5e-324), hi),
                      charts.binary_ticks(max(lo, 5e-324), hi)):
            assert 1 <= len(ticks) <= charts.MAX_TICKS and all(math.isfinite(t) for t in ticks)


def test_plotly_is_served_from_the_installed_package(client: TestClient) -> None:
    script = client.get(PLOTLY_JS_URL, headers={"Accept-Encoding": "identity"})
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert b"plotly.js v" in script.content[:200] and len(script.content) > 1_000_000
    zipped = client.get(PLOTLY_JS_URL, headers={"Accept-Encoding": "gzip"})
    assert zipped.content == script.content  # the client decompresses what was sent gzipped
    raw = client.stream("GET", PLOTLY_JS_URL, headers={"Accept-Encoding": "gzip"})
    with raw as response:
        body = b"".join(response.iter_raw())
        assert response.headers["content-encoding"] == "gzip" and len(body) < len(script.content) / 2
        assert gzip.decompress(body) == script.content
    css = client.get(PLOTLY_CSS_URL)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert ".js-plotly-plot .plotly .main-svg{" in css.text  # the rules plotly.js would inject
    guards = plotly_style_guard_ids()
    assert guards and all(re.fullmatch(r"[0-9a-f]{16,128}", i) for i in guards)


def test_pages_load_nothing_from_other_sites(client: TestClient) -> None:
    client.post("/plans/new", data={"model": "gpt2", "num_nodes": "1", "gpus_per_node": "8",
                                    "gpu": "H100-SXM-80GB", "seq_len": "512", "global_batch_tokens": "4096"})
    for path in ("/", "/plans/1", "/accuracy", "/calibrations", "/studies", "/studies/new", "/plans/new"):
        html = client.get(path).text
        sources = re.findall(r'<(?:script|link|img)[^>]*(?:src|href)="([^"]+)"', html)
        assert sources and all(s.startswith(("/", "data:")) for s in sources), (path, sources)
    page = client.get("/plans/1").text
    assert f'<script src="{PLOTLY_JS_URL}" defer></script>' in page
    assert f'id="plotly.js-style-global" class="no-inline-styles" href="{PLOTLY_CSS_URL}"' in page
    assert PLOTLY_JS_URL not in client.get("/").text  # pages without charts do not load it
