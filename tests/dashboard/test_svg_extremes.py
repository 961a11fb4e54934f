"""Charts from any numbers: every finite value (denormals, 1e308, all equal, one point, zeros) draws a
chart with finite coordinates, quickly, and never raises (a raise here was a 500 on /accuracy)."""

from __future__ import annotations

import math
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.dashboard import svg

FLOATS = st.floats(allow_nan=False, allow_infinity=False)
POSITIVE = st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False)
NUMBER = re.compile(r'(?<![\w-])(?:x|y|x1|x2|y1|y2|cx|cy|width|height)="([^"]*)"')
EXTREMES = [5e-324, sys.float_info.min, 1e-300, 1e-9, 0.0, 1.0, 1.0 + 2**-52, 1e20, 1e20 + 16384, 1e300,
            sys.float_info.max]


def assert_drawable(chart: str) -> None:
    coordinates = [float(v) for v in NUMBER.findall(chart)]
    assert coordinates and all(math.isfinite(v) for v in coordinates), chart[:400]
    assert "nan" not in chart.lower().replace("nanosec", "")


def xy(values: list[tuple[float, float]], *, log: bool, diagonal: bool = False) -> str:
    points = [svg.Point(x, y, "p") for x, y in values]
    return svg.xy_chart(
        chart_id="c", title="t", x_label="x", y_label="y", series=[svg.Series("s", points, "#000")],
        x_log=log, y_log=log, guides=[svg.GuideLine("y = x", diagonal=True)] if diagonal else [],
    )


@settings(max_examples=150, deadline=2000, derandomize=True, database=None)
@given(st.lists(st.tuples(FLOATS, FLOATS), min_size=1, max_size=6))
def test_linear_charts_draw_any_finite_values(values: list[tuple[float, float]]) -> None:
    assert_drawable(xy(values, log=False))


@settings(max_examples=150, deadline=2000, derandomize=True, database=None)
@given(st.lists(st.tuples(POSITIVE, POSITIVE), min_size=1, max_size=6), st.booleans())
def test_log_charts_draw_any_positive_values(values: list[tuple[float, float]], diagonal: bool) -> None:
    assert_drawable(xy(values, log=True, diagonal=diagonal))


@settings(max_examples=150, deadline=2000, derandomize=True, database=None)
@given(st.lists(FLOATS, min_size=0, max_size=8), st.lists(FLOATS, max_size=4))
def test_histograms_count_every_finite_value(first: list[float], second: list[float]) -> None:
    chart = svg.histogram(chart_id="h", title="t", series=[("a", first, "#000"), ("b", second, "#111")],
                          x_label="x")
    assert_drawable(chart)
    for name, values in (("a", first), ("b", second)):
        counted = sum(int(n) for n in re.findall(rf">{name}: (\d+) run\(s\)", chart))
        assert counted == len(values)


@pytest.mark.parametrize("value", EXTREMES)
def test_degenerate_data_one_value_or_all_equal(value: float) -> None:
    for count in (1, 3):
        assert_drawable(xy([(value, value)] * count, log=False))
        if value > 0:
            assert_drawable(xy([(value, value)] * count, log=True, diagonal=True))
    assert_drawable(svg.histogram(chart_id="h", title="t", series=[("a", [value] * 3, "#000")], x_label="x"))


def test_ticks_of_extreme_domains_are_finite_and_few() -> None:
    for lo, hi in [(5e-324, 1e-300), (1e-300, sys.float_info.max), (1e20, 1e20 + 16384),
                   (-sys.float_info.max, sys.float_info.max), (0.0, 5e-324)]:
        for ticks in (svg.nice_ticks(lo, hi), svg.log_ticks(max(lo, 5e-324), hi),
                      svg.binary_ticks(max(lo, 5e-324), hi)):
            assert 1 <= len(ticks) <= svg.MAX_TICKS and all(math.isfinite(t) for t in ticks)
