"""Numbers and record ids typed as text (dashboard paths, query strings and form fields, CLI options).

One reading for every such value: ASCII digits only, bounded before conversion. `str.isdigit()` is
true for '²' or '٣', which `int()` then refuses ('²') or silently reads ('٣' is 3), and `float()`
reads '٣' as 3.0; both are refused here, as the API's schemas refuse them, so a page answers with a
message rather than a 500 or another number.
"""

from __future__ import annotations

import math
import re

from planner.specs import ASCII_DECIMAL

MAX_ID = (1 << 53) - 1
"""The largest id every JSON client reads exactly (JavaScript numbers, and JSON Schema validators that
compare in floats: against 2^63 - 1 as a float, 2^63 + 191 passes); far beyond any table's ids. Declared
here, not in api/schemas/plans.py, so that the command line reads ids without importing fastapi."""
_ASCII_DIGITS = re.compile(r"[0-9]+")
MAX_DECIMAL_TEXT = 40
"""Longer than any price or duration a person types."""


def parse_whole(raw: str, *, low: int, high: int) -> int | None:
    """`raw` (surrounding spaces allowed) as an int in [low, high], or None if it is anything else."""
    text = raw.strip()
    if not _ASCII_DIGITS.fullmatch(text):
        return None
    # No int() over a long digit string (slow, and a value that long is out of range anyway).
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(high)):
        return None
    value = int(significant)
    return value if low <= value <= high else None


def parse_id(raw: str) -> int | None:
    """A stored row's id (plan, run, study, calibration profile): 1 to MAX_ID, or None."""
    return parse_whole(raw, low=1, high=MAX_ID)


def parse_decimal(raw: str, *, low: float = -math.inf, high: float = math.inf) -> float | None:
    """`raw` (surrounding spaces allowed) as a finite float in [low, high] (`2.49`, `-.5`, `1e3`), or None:
    ASCII digits only, no `inf` or `nan`."""
    text = raw.strip()
    if len(text) > MAX_DECIMAL_TEXT or not ASCII_DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) and low <= value <= high else None
