"""Two-stream timeline of one micro-batch: compute on one stream, collectives on the other.

Units are priced in forward order. Forward: all-gathers run up to `prefetch_depth` groups ahead
of compute. Backward runs in reverse: a group's all-gather (if parameters were resharded) is
prefetched while the previous group computes, and its reduce-scatter (plus, for a 2-D mesh, the
all-reduce over replicas) is issued when its gradients are ready. The comm stream executes in issue
order, as NCCL does on one communicator. Compute waits only for parameters; whatever comm time the
compute stream spends waiting, or that is left after the last backward kernel, is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


def simulate(
    groups: list[GroupTimes],
    *,
    prefetch_depth: int,
    contention: float,
    record: bool = False,
) -> TimelineResult:
    """Run forward then backward over the groups and account for exposed communication."""
    segments: list[tuple[str, str, str, float, float, float]] = []
    n = len(groups)
    depth = max(prefetch_depth, 0)
    comm_free = 0.0
    compute_end = 0.0
    compute_total = 0.0
    comm_total = 0.0
    exposed_ag = 0.0

    def run_compute(start: float, duration: float, busy_until: float) -> float:
        # Compute slows down by `contention` while a collective shares the device.
        overlap = min(duration, max(0.0, busy_until - start))
        return start + duration + contention * overlap

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
    for i, g in enumerate(groups):
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

    # ---- backward (reverse order)
    order = list(range(n - 1, -1, -1))
    gathered_end_b = {j: 0.0 for j in order}
    issued_b = 0

    def issue_backward(upto: int, at: float) -> None:
        nonlocal issued_b, comm_free, comm_total
        while issued_b <= min(upto, n - 1):
            j = order[issued_b]
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
    for pos, j in enumerate(order):
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

    exposed_reduce = max(0.0, comm_free - compute_end)
    total = compute_end + exposed_reduce
    if record and exposed_reduce > 0:
        segments.append(("comm", "backward", "wait reductions", compute_end, total, exposed_reduce))
    return TimelineResult(total, compute_total, comm_total, exposed_ag, exposed_reduce, segments)
