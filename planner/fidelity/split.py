"""The corpus split by source into *fit* and *held-out* (planner/fidelity/split.json, issue 37).

The held-out sources were chosen before any refit, from trainers other than torchtitan, and no fit
reads them: `fit_corpus` and its leave-one-source-out refits refuse a held-out source
(`require_fit_sources`), so that their runs measure the model as a user's would. Their residuals
calibrate the intervals every prediction carries (planner/fidelity/intervals.py). A source the split
does not name is held out: a new source tests the model until someone decides, in split.json and
with a reason, that the fit should read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Literal

SPLIT_PACKAGE = "planner.fidelity"
SPLIT_RESOURCE = "split.json"
Split = Literal["fit", "held-out"]


class HeldOutSourceError(ValueError):
    """A fit was handed a held-out source (the message names it)."""


@cache
def _split() -> tuple[frozenset[str], frozenset[str]]:
    text = resources.files(SPLIT_PACKAGE).joinpath(SPLIT_RESOURCE).read_text(encoding="utf-8")
    data = json.loads(text)
    fit, held_out = frozenset(data["fit"]), frozenset(data["held_out"])
    both = sorted(fit & held_out)
    if both:
        raise ValueError(f"{SPLIT_RESOURCE}: sources in both fit and held_out: {', '.join(both)}")
    return fit, held_out


def fit_sources() -> frozenset[str]:
    """The sources the fit may read."""
    return _split()[0]


def split_of(source: str) -> Split:
    """`fit` for the sources split.json lets the fit read; every other source is held out."""
    return "fit" if source in fit_sources() else "held-out"


def require_fit_sources(sources: Iterable[str]) -> None:
    """Refuse a fit over any held-out source."""
    held_out = sorted({source for source in sources if split_of(source) == "held-out"})
    if held_out:
        raise HeldOutSourceError(
            f"held-out sources may not reach a fit: {', '.join(held_out)} (planner/fidelity/split.json; "
            "select the fit's runs with `fit_split`)"
        )


__all__ = ["HeldOutSourceError", "Split", "fit_sources", "require_fit_sources", "split_of"]
