"""How "why the other families lost" reads to a person: the one grouping the CLI and the dashboard share.

A 70B or 405B plan rejects dozens of families for memory (every hybrid shard group x compile mode),
which buries the few that fit and lost on time. The plan document keeps every family (the API returns
them all); what a person is shown by default folds the out-of-memory ones into one line with their
count and the smallest overshoot, expandable (`--verbose` in the CLI, a `<details>` in the dashboard).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.plan import Plan, RejectedFamily

OOM_ROWS_SHOWN = 3
"""Up to this many out-of-memory families are listed one per row; more are folded into one line."""


@dataclass(frozen=True, slots=True)
class RejectedSummary:
    """The rejected families split into what is shown by default and what one line stands for."""

    shown: tuple[RejectedFamily, ...]
    """Every family that fits and lost (slower, or excluded by a re-plan) in the planner's order, and
    the out-of-memory families too when they are few, closest to fitting first."""
    folded: tuple[RejectedFamily, ...]
    """The out-of-memory families `line` stands for, closest to fitting first (empty when none are)."""
    line: str | None
    """`38 more families do not fit: the closest, hybrid_shard dp2x2 tp2 compiled, needs 84.0 GiB per GPU,
    15.7 GiB more than the 68.3 GiB that fits with the memory margin`; None when nothing is folded."""

    @property
    def every_family(self) -> tuple[RejectedFamily, ...]:
        """The whole list, as shown in full: the listed families, then the folded ones closest first."""
        return self.shown + self.folded


def summarize_rejected(plan: Plan) -> RejectedSummary:
    """Fold the plan's out-of-memory families into one line when there are more than `OOM_ROWS_SHOWN`."""
    oom = [r for r in plan.rejected if r.kind == "oom"]
    shown = tuple(r for r in plan.rejected if r.kind != "oom")
    plan_limit = memory_limit_gib(plan)

    def limit(family: RejectedFamily) -> float | None:
        return family.memory_limit_gib if family.memory_limit_gib is not None else plan_limit

    def overshoot(family: RejectedFamily) -> float:
        family_limit = limit(family)
        return _least_gib(family) - (family_limit or 0.0)

    # Closest to fitting first (a mesh's margin sets its limit); by the family name too, so that
    # ties (2x2, 4x2 and 8x2 often need the same) read stably.
    folded = tuple(sorted(oom, key=lambda r: (overshoot(r), _least_gib(r), r.family)))
    if len(oom) <= OOM_ROWS_SHOWN:  # listed after those that fit, closest to fitting first
        return RejectedSummary(shown=shown + folded, folded=(), line=None)
    closest = folded[0]
    need = _least_gib(closest)
    what = f"{len(folded)} more families" if shown else f"{len(folded)} families"
    if not math.isfinite(need):
        return RejectedSummary(shown=shown, folded=folded, line=f"{what} do not fit in memory")
    line = f"{what} do not fit: the closest, {closest.family}, needs {need:.1f} GiB per GPU"
    closest_limit = limit(closest)
    if closest_limit is not None:
        line += (
            f", {need - closest_limit:.1f} GiB more than the {closest_limit:.1f} GiB that fits with the "
            "memory margin"
        )
    return RejectedSummary(shown=shown, folded=folded, line=line)


def memory_limit_gib(plan: Plan) -> float | None:
    """The largest peak the search let the chosen mesh have (planner.cost.memory.memory_limit_gib,
    read back from the stored prediction: usable memory less the headroom, over one plus the
    margin); None for plans stored before schema 1.1, which lack the margin."""
    pred = plan.prediction
    if pred.usable_memory_gib is None or pred.memory_margin is None:
        return None
    return pred.usable_memory_gib / (1.0 + pred.memory_margin)


def _least_gib(family: RejectedFamily) -> float:
    # An out-of-memory family always carries its least peak (planner/ranking.py); a document written
    # by hand may not: it sorts last.
    return family.min_peak_memory_gib if family.min_peak_memory_gib is not None else float("inf")
