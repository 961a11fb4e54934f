"""Find the repeated stretches of a sequence, so that identical blocks are priced once.

A model of 1,000 identical blocks lays out as a handful of distinct communication groups; the
timeline (planner/cost/timeline.py) simulates a few periods of each repeated stretch, then
fast-forwards through the rest once its state repeats. This module only finds the stretches.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MAX_PERIOD = 16
"""Longest pattern looked for: enough for every k-th-block checkpointing over any wrap unit, and
for traced graphs whose blocks alternate a few kinds of module."""


@dataclass(frozen=True, slots=True)
class Run:
    """Items `start .. start + period * repeats - 1`: the first `period` of them, repeated."""

    start: int
    period: int
    repeats: int

    @property
    def end(self) -> int:
        return self.start + self.period * self.repeats


def periodic_runs(keys: Sequence[Hashable]) -> tuple[Run, ...]:
    """Cover `keys` with consecutive runs, each as long as a short period lets it be.

    Greedy from the left: at each position the period (up to MAX_PERIOD) that repeats furthest
    wins, the shortest among equals; a position that starts no repetition is a run of one.
    """
    n = len(keys)
    runs: list[Run] = []
    start = 0
    while start < n:
        best = Run(start, 1, 1)
        for period in range(1, MAX_PERIOD + 1):
            if start + 2 * period > n:
                break
            end = start + period
            while end < n and keys[end] == keys[end - period]:
                end += 1
            repeats = (end - start) // period
            if repeats >= 2 and period * repeats > best.period * best.repeats:
                best = Run(start, period, repeats)
            if end == n:
                break  # a longer period cannot cover more
        runs.append(best)
        start = best.end
    return tuple(runs)
