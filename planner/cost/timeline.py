"""Two-stream timeline of one micro-batch: compute on one stream, collectives on the other.

Units are priced in forward order. Forward: all-gathers run up to `prefetch_depth` groups ahead
of compute. Backward runs in reverse: a group's all-gather (if parameters were resharded) is
prefetched while the previous group computes, and its reduce-scatter (plus, for a 2-D mesh, the
all-reduce over replicas) is issued when its gradients are ready. The comm stream executes in issue
order, as NCCL does on one communicator. Compute waits only for parameters; whatever comm time the
compute stream spends waiting, or that is left after the last backward kernel, is exposed.

Repeated blocks: groups given as `RepeatedGroups` (runs of a repeated pattern) are simulated until
the streams' state at the start of a pattern repeats that of the period before, relative to the
compute stream's clock; from there every further period adds the same times (the simulation is
shift-invariant), so whole periods are added at once. A 1,000-block model costs a few periods.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.cost.repeats import Run

SAME_STATE_TOLERANCE = 1e-12
"""Relative to the elapsed time: closer than this, two states are the same (rounding, not a change)."""


@dataclass(frozen=True, slots=True)
class GroupTimes:
    """Seconds for one communication group (one or more wrap units) in one micro-batch."""

    forward: float
    backward: float
    """Backward compute including recomputation of checkpointed activations."""
    all_gather_forward: float
    all_gather_backward: float
    """Zero when parameters stay unsharded between forward and backward."""
    reduce: float
    """Gradient reduction after the group's backward (reduce-scatter and/or all-reduce)."""


@dataclass(slots=True)
class TimelineResult:
    total_s: float
    compute_s: float
    comm_s: float
    exposed_all_gather_s: float
    exposed_reduce_s: float
    segments: list[tuple[str, str, str, float, float, float]] = field(default_factory=list)
    """(stream, phase, label, start, end, exposed) when recording was asked for."""


class RepeatedGroups(Sequence[GroupTimes]):
    """Groups in forward order, stored once per run of a repeated pattern (planner/cost/repeats.py)."""

    def __init__(self, runs: tuple[Run, ...], patterns: tuple[tuple[GroupTimes, ...], ...]) -> None:
        self.runs = runs
        self.patterns = patterns
        self._starts = [run.start for run in runs]

    def __len__(self) -> int:
        return self.runs[-1].end

    def run_index(self, i: int) -> int:
        return bisect.bisect_right(self._starts, i) - 1

    def __getitem__(self, i: int) -> GroupTimes:  # type: ignore[override]
        r = self.run_index(i)
        return self.patterns[r][(i - self.runs[r].start) % self.runs[r].period]


@dataclass(slots=True)
class _Mark:
    """The state at the start of one period of a run, to compare with the next period's."""

    run: int
    position: int
    state: tuple[float, ...]
    totals: tuple[float, ...]


class _Periods:
    """Where one pass over the groups (forward, or backward in reverse order) may jump whole
    periods of a repeated run: at a period's start whose state, relative to the clock, is that of
    the period before."""

    def __init__(self, groups: RepeatedGroups, *, reverse: bool, lookahead: int) -> None:
        self.groups = groups
        self.reverse = reverse
        self.lookahead = lookahead
        self.mark: _Mark | None = None

    def boundary(self, position: int) -> tuple[int, int, int] | None:
        """(run, period, periods that may be jumped) when `position` starts a period of a run."""
        n = len(self.groups)
        r = self.groups.run_index(n - 1 - position if self.reverse else position)
        run = self.groups.runs[r]
        first = n - run.end if self.reverse else run.start  # the run's first position in this pass
        if run.repeats <= 2 or (position - first) % run.period:
            return None
        # Whole periods whose groups, and the gathers prefetched for them, all lie in the run.
        last = first + run.period * run.repeats - self.lookahead
        return r, run.period, (last - position) // run.period

    def jump(
        self, at: tuple[int, int, int], position: int, state: tuple[float, ...], totals: tuple[float, ...]
    ) -> tuple[int, list[float]] | None:
        """(periods to jump, each total's change per period) when the state repeats; else None,
        and this period's start is remembered. `totals[0]` is the clock."""
        r, period, periods = at
        mark = self.mark
        if mark and mark.run == r and mark.position == position - period and periods > 0:
            tolerance = SAME_STATE_TOLERANCE * max(totals[0], 1e-30)
            if len(mark.state) == len(state) and all(
                abs(a - b) <= tolerance for a, b in zip(mark.state, state, strict=True)
            ):
                self.mark = None
                return periods, [a - b for a, b in zip(totals, mark.totals, strict=True)]
        self.mark = _Mark(r, position, state, totals)
        return None


def _compute_only(groups: RepeatedGroups) -> bool:
    return not any(
        g.all_gather_forward or g.all_gather_backward or g.reduce
        for pattern in groups.patterns
        for g in pattern
    )


@dataclass(frozen=True, slots=True)
class CommFloor:
    """What a micro-batch's collectives force on its timeline, whatever its compute: the compute
    stream runs every group's work after the first group's all-gather (nothing runs before it to
    hide it) and before the first group's reduction (issued after the last backward), and the comm
    stream runs every collective one after another. It lets the search leave configurations that
    cannot win untimed (planner/search.py) without simulating them."""

    first_gather: float
    first_reduce: float
    total: float

    @classmethod
    def of(cls, groups: RepeatedGroups) -> CommFloor:
        total = sum(
            run.repeats * sum(g.all_gather_forward + g.all_gather_backward + g.reduce for g in pattern)
            for run, pattern in zip(groups.runs, groups.patterns, strict=True)
        )
        return cls(groups[0].all_gather_forward, groups[0].reduce, total)

    def floor_s(self, compute_s: float) -> float:
        """A lower bound on `simulate(...).total_s` of these collectives' groups holding `compute_s`
        of compute in all, at any prefetch depth and contention."""
        return max(self.first_gather + compute_s + self.first_reduce, self.total)


def simulate(
    groups: Sequence[GroupTimes],
    *,
    prefetch_depth: int,
    contention: float,
    record: bool = False,
) -> TimelineResult:
    """Run forward then backward over the groups and account for exposed communication.

    With `RepeatedGroups` (and no recording) repeated periods are fast-forwarded, see above.
    """
    if not record and isinstance(groups, RepeatedGroups) and _compute_only(groups):
        # Nothing to overlap (a pipeline's middle micro-batches under FSDP2, one rank alone): the
        # timeline is the compute stream's work.
        compute = sum(
            run.repeats * sum(g.forward + g.backward for g in pattern)
            for run, pattern in zip(groups.runs, groups.patterns, strict=True)
        )
        return TimelineResult(compute, compute, 0.0, 0.0, 0.0)
    segments: list[tuple[str, str, str, float, float, float]] = []
    n = len(groups)
    depth = max(prefetch_depth, 0)
    repeated = groups if isinstance(groups, RepeatedGroups) and not record else None
    comm_free = 0.0
    compute_end = 0.0
    compute_total = 0.0
    comm_total = 0.0
    exposed_ag = 0.0

    def run_compute(start: float, duration: float, busy_until: float) -> float:
        # Compute slows down by `contention` while a collective shares the device.
        overlap = min(duration, max(0.0, busy_until - start))
        return start + duration + contention * overlap

    def ahead(t: float) -> float:
        # Only how far a time lies past the compute stream matters to what follows.
        return max(0.0, t - compute_end)

    def totals() -> tuple[float, float, float, float]:
        return compute_end, compute_total, comm_total, exposed_ag

    def advance(count: int, deltas: list[float]) -> None:
        """Jump `count` periods, each adding `deltas` to `totals()` (the clock's to both streams)."""
        nonlocal compute_end, comm_free, compute_total, comm_total, exposed_ag
        step, d_compute, d_comm, d_exposed = deltas
        compute_end += count * step
        comm_free += count * step
        compute_total += count * d_compute
        comm_total += count * d_comm
        exposed_ag += count * d_exposed

    # ---- forward
    gathered_end = [0.0] * n
    issued = 0

    def issue_forward(upto: int, at: float) -> None:
        nonlocal issued, comm_free, comm_total
        while issued <= min(upto, n - 1):
            g = groups[issued]
            start = max(comm_free, at)
            comm_free = start + g.all_gather_forward
            comm_total += g.all_gather_forward
            gathered_end[issued] = comm_free
            if record and g.all_gather_forward > 0:
                segments.append(("comm", "forward", f"all-gather group {issued}", start, comm_free, 0.0))
            issued += 1

    issue_forward(depth, 0.0)
    periods = _Periods(repeated, reverse=False, lookahead=depth) if repeated is not None else None
    i = 0
    while i < n:
        if periods and i > 0 and (at := periods.boundary(i)):
            state = (issued - i, ahead(comm_free), *(ahead(gathered_end[j]) for j in range(i, issued)))
            jump = periods.jump(at, i, state, totals())
            if jump:
                count, deltas = jump
                shift = count * at[1]
                ahead_ends = [gathered_end[j] + count * deltas[0] for j in range(i, issued)]
                gathered_end[i + shift : issued + shift] = ahead_ends
                issued += shift
                advance(count, deltas)
                i += shift
                continue
        g = groups[i]
        issue_forward(i, compute_end)  # without prefetch, gather on demand
        start = max(compute_end, gathered_end[i])
        wait = start - compute_end
        exposed_ag += wait
        issue_forward(i + depth, start)
        end = run_compute(start, g.forward, comm_free)
        compute_total += end - start
        if record:
            if wait > 0:
                segments.append(("comm", "forward", f"wait all-gather {i}", compute_end, start, wait))
            segments.append(("compute", "forward", f"forward group {i}", start, end, 0.0))
        compute_end = end
        i += 1

    # ---- backward (reverse order: position `pos` runs group n - 1 - pos)
    gathered_end_b = [0.0] * n
    issued_b = 0

    def issue_backward(upto: int, at: float) -> None:
        nonlocal issued_b, comm_free, comm_total
        while issued_b <= min(upto, n - 1):
            j = n - 1 - issued_b
            g = groups[j]
            if g.all_gather_backward > 0:
                start = max(comm_free, at)
                comm_free = start + g.all_gather_backward
                comm_total += g.all_gather_backward
                gathered_end_b[j] = comm_free
                if record:
                    segments.append(("comm", "backward", f"all-gather group {j}", start, comm_free, 0.0))
            else:
                gathered_end_b[j] = at
            issued_b += 1

    issue_backward(depth, compute_end)
    periods = _Periods(repeated, reverse=True, lookahead=depth) if repeated is not None else None
    pos = 0
    while pos < n:
        j = n - 1 - pos
        if periods and pos > 0 and (at := periods.boundary(pos)):
            pending = range(pos, issued_b)
            state = (issued_b - pos, ahead(comm_free), *(ahead(gathered_end_b[n - 1 - q]) for q in pending))
            jump = periods.jump(at, pos, state, totals())
            if jump:
                count, deltas = jump
                shift = count * at[1]
                ahead_ends = [gathered_end_b[n - 1 - q] + count * deltas[0] for q in pending]
                for q, value in zip(range(pos + shift, issued_b + shift), ahead_ends, strict=True):
                    gathered_end_b[n - 1 - q] = value
                issued_b += shift
                advance(count, deltas)
                pos += shift
                continue
        g = groups[j]
        issue_backward(pos, compute_end)
        start = max(compute_end, gathered_end_b[j])
        wait = start - compute_end
        exposed_ag += wait
        issue_backward(pos + depth, start)
        end = run_compute(start, g.backward, comm_free)
        compute_total += end - start
        if record:
            if wait > 0:
                segments.append(("comm", "backward", f"wait all-gather {j}", compute_end, start, wait))
            segments.append(("compute", "backward", f"backward group {j}", start, end, 0.0))
        compute_end = end
        if g.reduce > 0:
            rs_start = max(comm_free, end)
            comm_free = rs_start + g.reduce
            comm_total += g.reduce
            if record:
                segments.append(("comm", "backward", f"reduce group {j}", rs_start, comm_free, 0.0))
        pos += 1

    exposed_reduce = max(0.0, comm_free - compute_end)
    total = compute_end + exposed_reduce
    if record and exposed_reduce > 0:
        segments.append(("comm", "backward", "wait reductions", compute_end, total, exposed_reduce))
    return TimelineResult(total, compute_total, comm_total, exposed_ag, exposed_reduce, segments)
