"""Number formatting shared by the charts and the templates (registered as Jinja filters)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Protocol

# Durations read the same everywhere (CLI, reasons, pages): one formatter, the planner's.
from planner.formatting import between, duration, money, quantity


def compact_number(value: float) -> str:
    """1234 -> 1.23k, 0.00012 -> 120µ: short tick labels for any magnitude."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = abs(value)
    for threshold, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    if magnitude >= 0.01:
        return f"{value:.3g}"
    for threshold, suffix in ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n")):
        if magnitude >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.2g}"


def binary_bytes(value: float) -> str:
    """Bytes with binary prefixes (message sizes, memory)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.4g} B"


def percent(value: float) -> str:
    return f"{value * 100:.3g}%"


def gib(value: float | None) -> str:
    return "–" if value is None else f"{value:,.2f} GiB"


def thousands(value: float | None) -> str:
    """1234567.8 -> 1,234,568 (rates and counts are read, not compared to the last digit)."""
    return "–" if value is None else f"{value:,.0f}"


def signed_percent(value: float | None) -> str:
    """An error already in percent: +12.3% / -4.0%."""
    return "–" if value is None else f"{value:+.1f}%"


def signed_fraction(value: float | None) -> str:
    """An error as a fraction (the fidelity report's): 0.123 -> +12.3%."""
    return signed_percent(None if value is None else value * 100)


def dollars(value: float | None) -> str:
    return "–" if value is None else money(value)


def days(value: float | None) -> str:
    """Days to train: 597, 12.5, 0.31 (three significant digits below ten)."""
    if value is None or not math.isfinite(value):
        return "–"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def timestamp(value: datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M} UTC"


def optional_seconds(value: float | None) -> str:
    return "–" if value is None else duration(value)


class _Interval(Protocol):
    low: float
    high: float


def interval(value: _Interval | tuple[float, float] | None, decimals: int = 0) -> str:
    """A prediction's interval as its two ends, `7,193–8,737` (`–` where a plan has none); a plan's
    interval or the (low, high) of a fidelity report's run."""
    if value is None:
        return "–"
    low, high = value if isinstance(value, tuple) else (value.low, value.high)
    return between(low, high, decimals=decimals)


FILTERS = {
    "seconds": optional_seconds,
    "percent": percent,
    "signed_percent": signed_percent,
    "signed_fraction": signed_fraction,
    "gib": gib,
    "thousands": thousands,
    "quantity": quantity,
    "bytes": binary_bytes,
    "timestamp": timestamp,
    "compact": compact_number,
    "dollars": dollars,
    "days": days,
    "interval": interval,
}
