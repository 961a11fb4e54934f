"""The SVG chart builder: ticks, scales, escaping, and marks that match the data."""

from __future__ import annotations

import re

from api.dashboard import svg
from api.dashboard.formatting import binary_bytes, compact_number, duration


def test_ticks_are_round_numbers_inside_the_domain() -> None:
    assert svg.nice_ticks(0, 97) == [0, 20, 40, 60, 80]
    assert svg.nice_ticks(0.0013, 0.0061) == [0.002, 0.003, 0.004, 0.005, 0.006]
    assert svg.log_ticks(3e6, 2e12)[:3] == [1e7, 1e8, 1e9]
    assert svg.log_ticks(15, 800) == [20, 50, 100, 200, 500]
    assert [binary_bytes(t) for t in svg.binary_ticks(900, 1.2 * 2**30)] == [
        "1 KiB", "16 KiB", "256 KiB", "4 MiB", "64 MiB", "1 GiB"
    ]


def test_scales_map_ends_to_ends() -> None:
    linear = svg.Scale(0, 10, 100, 200)
    assert (linear(0), linear(5), linear(10)) == (100, 150, 200)
    log = svg.Scale(1, 1000, 0, 300, log=True)
    assert round(log(10)) == 100 and round(log(100)) == 200
    assert svg.Scale(5, 5, 0, 100)(5) == 50  # a degenerate domain sits in the middle


def test_formatters() -> None:
    assert compact_number(1234) == "1.23k" and compact_number(0.00012) == "120µ"
    assert duration(0.0055) == "5.5 ms" and duration(2.07) == "2.07 s" and duration(3e-5) == "30 µs"
    assert binary_bytes(3 << 20) == "3 MiB" and binary_bytes(1000) == "1000 B"


def test_text_is_escaped_in_labels_and_tooltips() -> None:
    hostile = '<script>alert("x")</script>'
    chart = svg.xy_chart(
        chart_id="c", title=hostile, x_label=hostile, y_label="y",
        series=[svg.Series(hostile, [svg.Point(1, 2, hostile)], "#000")],
    )
    assert "<script>" not in chart and "&lt;script&gt;" in chart
    bars = svg.stacked_bars(chart_id="b", title="t", bars=[svg.Bar(hostile, [("a&b", 1.0)])], x_label="x",
                            colors={"a&b": "#000"})
    assert "<script>" not in bars and "a&amp;b" in bars


def test_marks_match_the_data() -> None:
    empty = svg.xy_chart(chart_id="e", title="t", x_label="x", y_label="y", series=[])
    assert 'class="mark' not in empty
    points = [svg.Point(i, i * i, f"p{i}") for i in range(1, 6)]
    chart = svg.xy_chart(chart_id="c", title="t", x_label="x", y_label="y",
                         series=[svg.Series("s", points, "#000", line=True)])
    assert len(re.findall(r"<circle [^>]*class=\"mark\"", chart)) == 5
    assert len(re.findall(r"<path [^>]*class=\"mark\"", chart)) == 1

    values = [-12.0, -3.5, 0.0, 0.1, 4.0, 4.0, 19.9]
    histogram = svg.histogram(chart_id="h", title="t", series=[("err", values, "#000")], x_label="x")
    counts = [int(n) for n in re.findall(r"err: (\d+) run\(s\)", histogram)]
    assert sum(counts) == len(values)  # every value lands in exactly one bin, the maximum included

    timeline = svg.timeline(chart_id="t", title="t", lanes=["a", "b"], legend=[],
                            spans=[svg.Span("a", 0, 1, "#000", "x"), svg.Span("b", 1, 3, "#000", "y")])
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"[^>]*class="mark"', timeline)]
    assert len(widths) == 2 and abs(widths[1] / widths[0] - 2) < 0.01  # widths proportional to durations
