"""How durations read to a person: the one formatter the planner's reasons, the CLI and the dashboard share
(and counts, money and an interval's two ends).

A step of a 405B plan lasts minutes and a kernel microseconds; printing both in one fixed unit gives
"486854 ms/step". `duration` picks the unit that keeps three significant digits readable.
"""

from __future__ import annotations

import math

# (unit, seconds per unit, first rounded magnitude that moves to the next unit). Seconds run to 2 min
# and minutes to 2 h, so "90 s" and "95 min" stay in the unit people say them in.
_UNITS: tuple[tuple[str, float, float], ...] = (
    ("µs", 1e-6, 1000.0),
    ("ms", 1e-3, 1000.0),
    ("s", 1.0, 120.0),
    ("min", 60.0, 120.0),
    ("h", 3600.0, math.inf),
)


def _three_digits(value: float) -> str:
    """Three significant digits, no exponent, no trailing zeros: 0.01234 -> 0.0123, 486.8 -> 487."""
    rounded = float(f"{value:.3g}")  # round first: 0.99996 becomes 1, not 1.000
    if rounded == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(rounded))))
    text = f"{rounded:,.{decimals}f}"
    # Trailing zeros claim a precision nothing measured (and crowd chart ticks): 5.50 ms reads 5.5 ms.
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(seconds: float) -> str:
    """A duration in µs, ms (below 1 s), s (below 2 min), min (below 2 h) or h: `2.04 s`, `8.11 min`."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if seconds == 0:
        return "0 s"
    magnitude = abs(seconds)
    if magnitude < 1e-9:  # below a nanosecond nothing is measured: say it is that small, in seconds
        return f"{seconds:.3g} s"
    for unit, size, limit in _UNITS:
        text = _three_digits(seconds / size)
        # Decide on the rounded text, so 999.96 ms reads 1.00 s and never 1,000 ms.
        if abs(float(text.replace(",", ""))) < limit:
            return f"{text} {unit}"
    raise AssertionError("unreachable: the last unit has no limit")


def quantity(value: float) -> str:
    """Counts at a glance: 789, 45.6K, 29.4M, 1.5B, 15T (tokens, GPU-hours)."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= size:
            return f"{_three_digits(value / size)}{suffix}"
    return _three_digits(value) if abs(value) < 100 else f"{value:.0f}"


def between(low: float, high: float, *, decimals: int = 0) -> str:
    """An interval's two ends in one format, `7,031–8,938` or `47.7–56.0` (an en dash: a hyphen
    would read as a minus sign)."""
    return f"{low:,.{decimals}f}–{high:,.{decimals}f}"


def money(usd: float) -> str:
    """US dollars at a glance: $0.42, $789, $45.6K, $87.8M."""
    return f"${usd:.2f}" if abs(usd) < 100 else f"${quantity(usd)}"


BITS_PER_BYTE = 8


def network_bandwidth(gbps_per_gpu: float) -> str:
    """A cluster's stated scale-out network (GB/s per GPU) as NICs are sold and as GB/s:
    `400 Gb/s per GPU (50 GB/s)`."""
    return f"{gbps_per_gpu * BITS_PER_BYTE:,g} Gb/s per GPU ({gbps_per_gpu:,g} GB/s)"
