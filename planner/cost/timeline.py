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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

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


@dataclass(frozen=True, slots=True)
class _Pass:
    """What tells the forward pass over the groups from the backward pass."""

    phase: str
    reverse: bool
    """Backward walks the groups last to first."""
    compute: Callable[[GroupTimes], float]
    gather: Callable[[GroupTimes], float]
    queues_empty_gathers: bool
    """Forward issues every group's all-gather in the comm stream, an empty one too; backward
    issues none for a group whose parameters stayed gathered (they are ready when asked for). The
    two agree on every time reported, but not always on the state a fast-forward compares, so they
    stay apart: merged, a jump could come a period later and round differently."""
    reduces: bool
    """Backward reduces each group's gradients once they are computed."""

    def group(self, n: int, position: int) -> int:
        """The group the pass computes at `position`."""
        return n - 1 - position if self.reverse else position


_FORWARD = _Pass(
    "forward",
    reverse=False,
    compute=attrgetter("forward"),
    gather=attrgetter("all_gather_forward"),
    queues_empty_gathers=True,
    reduces=False,
)
_BACKWARD = _Pass(
    "backward",
    reverse=True,
    compute=attrgetter("backward"),
    gather=attrgetter("all_gather_backward"),
    queues_empty_gathers=False,
    reduces=True,
)


@dataclass(slots=True)
class _Streams:
    """The compute and comm streams of one micro-batch: their clocks, the work each has done, and
    which of the current pass's all-gathers the comm stream has been issued."""

    contention: float
    record: bool
    compute_end: float = 0.0
    """The compute stream's clock: when its last kernel ends."""
    comm_free: float = 0.0
    """The comm stream's clock: when its last collective ends."""
    compute_total: float = 0.0
    comm_total: float = 0.0
    exposed_ag: float = 0.0
    issued: int = 0
    """Positions of the current pass whose all-gathers are issued."""
    ready: list[float] = field(default_factory=list)
    """When each position's parameters are gathered, by position in the current pass."""
    segments: list[tuple[str, str, str, float, float, float]] = field(default_factory=list)

    def start_pass(self, n: int) -> None:
        self.issued = 0
        self.ready = [0.0] * n

    def ahead(self, t: float) -> float:
        # Only how far a time lies past the compute stream matters to what follows.
        return max(0.0, t - self.compute_end)

    def totals(self) -> tuple[float, float, float, float]:
        return self.compute_end, self.compute_total, self.comm_total, self.exposed_ag

    def issue(self, groups: Sequence[GroupTimes], way: _Pass, *, upto: int, at: float) -> None:
        """Issue the all-gathers of positions up to `upto`, none starting before `at`."""
        n = len(groups)
        while self.issued <= min(upto, n - 1):
            index = way.group(n, self.issued)
            seconds = way.gather(groups[index])
            if seconds > 0 or way.queues_empty_gathers:
                start = max(self.comm_free, at)
                self.comm_free = start + seconds
                self.comm_total += seconds
                self.ready[self.issued] = self.comm_free
                if self.record and seconds > 0:
                    segment = ("comm", way.phase, f"all-gather group {index}", start, self.comm_free, 0.0)
                    self.segments.append(segment)
            else:
                self.ready[self.issued] = at
            self.issued += 1

    def run_compute(self, start: float, duration: float) -> float:
        """When a kernel of `duration` started at `start` ends."""
        # Compute slows down by `contention` while a collective shares the device.
        overlap = min(duration, max(0.0, self.comm_free - start))
        return start + duration + self.contention * overlap

    def reduce(self, index: int, seconds: float) -> None:
        """Issue group `index`'s gradient reduction once its backward has ended."""
        start = max(self.comm_free, self.compute_end)
        self.comm_free = start + seconds
        self.comm_total += seconds
        if self.record:
            self.segments.append(("comm", "backward", f"reduce group {index}", start, self.comm_free, 0.0))

    def fast_forward(self, periods: _Periods, at: tuple[int, int, int], position: int) -> int:
        """Positions jumped (whole periods) when the state at `position` repeats; else 0."""
        pending = range(position, self.issued)
        state = (
            self.issued - position,
            self.ahead(self.comm_free),
            *(self.ahead(self.ready[q]) for q in pending),
        )
        jump = periods.jump(at, position, state, self.totals())
        if not jump:
            return 0
        count, deltas = jump
        shift = count * at[1]
        self.ready[position + shift : self.issued + shift] = [
            self.ready[q] + count * deltas[0] for q in pending
        ]
        self.issued += shift
        # Each period adds `deltas` to `totals()` (the clock's to both streams).
        step, d_compute, d_comm, d_exposed = deltas
        self.compute_end += count * step
        self.comm_free += count * step
        self.compute_total += count * d_compute
        self.comm_total += count * d_comm
        self.exposed_ag += count * d_exposed
        return shift

    def result(self) -> TimelineResult:
        """The micro-batch's times once backward is done: reductions still running are exposed."""
        exposed_reduce = max(0.0, self.comm_free - self.compute_end)
        total = self.compute_end + exposed_reduce
        if self.record and exposed_reduce > 0:
            self.segments.append(
                ("comm", "backward", "wait reductions", self.compute_end, total, exposed_reduce)
            )
        return TimelineResult(
            total, self.compute_total, self.comm_total, self.exposed_ag, exposed_reduce, self.segments
        )


def _step(streams: _Streams, groups: Sequence[GroupTimes], way: _Pass, *, position: int, depth: int) -> None:
    """Compute the group at `position`: wait for its parameters, prefetch `depth` ahead, reduce."""
    index = way.group(len(groups), position)
    g = groups[index]
    clock = streams.compute_end
    streams.issue(groups, way, upto=position, at=clock)  # without prefetch, gather on demand
    start = max(clock, streams.ready[position])
    wait = start - clock
    streams.exposed_ag += wait
    streams.issue(groups, way, upto=position + depth, at=start)
    end = streams.run_compute(start, way.compute(g))
    streams.compute_total += end - start
    if streams.record:
        if wait > 0:
            streams.segments.append(("comm", way.phase, f"wait all-gather {index}", clock, start, wait))
        streams.segments.append(("compute", way.phase, f"{way.phase} group {index}", start, end, 0.0))
    streams.compute_end = end
    if way.reduces and g.reduce > 0:
        streams.reduce(index, g.reduce)


def _walk(
    streams: _Streams,
    groups: Sequence[GroupTimes],
    way: _Pass,
    *,
    depth: int,
    repeated: RepeatedGroups | None,
) -> None:
    """One pass over the groups in `way`'s order, jumping whole repeated periods where it may."""
    n = len(groups)
    streams.start_pass(n)
    streams.issue(groups, way, upto=depth, at=streams.compute_end)
    periods = _Periods(repeated, reverse=way.reverse, lookahead=depth) if repeated is not None else None
    position = 0
    while position < n:
        if periods and position > 0 and (at := periods.boundary(position)):
            jumped = streams.fast_forward(periods, at, position)
            if jumped:
                position += jumped
                continue
        _step(streams, groups, way, position=position, depth=depth)
        position += 1


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
    repeated = groups if isinstance(groups, RepeatedGroups) and not record else None
    streams = _Streams(contention=contention, record=record)
    for way in (_FORWARD, _BACKWARD):
        _walk(streams, groups, way, depth=max(prefetch_depth, 0), repeated=repeated)
    return streams.result()
