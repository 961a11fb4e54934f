"""Whole numbers and record ids typed as text (dashboard paths, query strings and form fields).

One reading for every such value: ASCII digits only, bounded before conversion. `str.isdigit()` is
true for '²' or '٣', which `int()` then refuses ('²') or silently reads ('٣' is 3); both are refused
here, as the API's schemas refuse them, so a page answers with a message rather than a 500.
"""

from __future__ import annotations

import re

from api.schemas.plans import MAX_ID

_ASCII_DIGITS = re.compile(r"[0-9]+")


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
