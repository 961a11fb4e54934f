"""One duration formatter for the planner's reasons, the CLI and the dashboard: readable at any scale."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from api.dashboard import formatting as dashboard_formatting
from planner.formatting import duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (2.5e-6, "2.5 µs"),
        (0.04123, "41.2 ms"),
        (0.99949, "999 ms"),
        (0.99996, "1 s"),  # rounded before the unit is chosen: never "1,000 ms"
        (2.038, "2.04 s"),
        (95.0, "95 s"),
        (119.96, "2 min"),
        (486.854, "8.11 min"),  # the "486854 ms/step" of issue 12
        (7300.0, "2.03 h"),
        (-0.5, "-500 ms"),
        (float("inf"), "inf s"),
    ],
)
def test_duration_picks_a_readable_unit(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_dashboard_uses_the_same_formatter() -> None:
    assert dashboard_formatting.FILTERS["seconds"](486.854) == "8.11 min"
    assert dashboard_formatting.FILTERS["seconds"](None) == "–"


def test_a_405b_plan_prints_minutes_and_seconds_not_thousands_of_ms() -> None:
    result = CliRunner().invoke(
        app,
        ["plan", "--model", "llama3.1-405b", "--cluster", "128x8xH100", "--seq-len", "2048",
         "--global-batch-tokens", str(2048 * 2048)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"step time\s+\d+(\.\d+)? (s|min)\b", result.output), result.output
    assert re.search(r"exposed comm\s+\d+(\.\d+)? (ms|s|min)/step of", result.output), result.output
    # No duration of a second or more is written in milliseconds, anywhere (reasons included).
    assert not re.search(r"\d{4,}(\.\d+)? ms|\d,\d{3} ms", result.output), result.output
