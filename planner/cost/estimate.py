"""Predict step time and peak memory of one parallel configuration.

`Estimator.memory()` (planner/cost/memory.py) is cheap and runs first so that search can prune by
memory before paying for the timeline in `Estimator.timing()`; both share the configuration's
collective layout (planner/cost/layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.layout import CommLayout, comm_layout
from planner.cost.memory import (
    MemoryEstimate,
    SavedActivations,
    compiled_keeps,
    memory_moments,
    saved_activations,
)
from planner.cost.model_costs import UnitCost
from planner.cost.parameters import CostParameters, LinkClass
from planner.cost.repeats import Run, periodic_runs
from planner.cost.setting import Choice, Setting
from planner.cost.timeline import GroupTimes, RepeatedGroups, TimelineResult, simulate


@dataclass(frozen=True, slots=True)
class GroupShape:
    """One group's units and gradient reductions, each kind listed once with how many there are."""

    group: int
    units: tuple[tuple[int, UnitCost, int], ...]
    """(a block index standing for the units alike, the unit, how many)."""
    reduces: tuple[tuple[int, int, int], ...]
    """(parameters, kernel launches, how many) of the reduction buckets completing in the group."""


@dataclass(frozen=True, slots=True)
class RepeatedLayout:
    """A layout's groups as runs of a repeated pattern, for one checkpointing policy."""

    runs: tuple[Run, ...]
    patterns: tuple[tuple[GroupShape, ...], ...]
    """Per run, the groups of its first period."""


def repeated_layout(layout: CommLayout, choice: Choice) -> RepeatedLayout:
    """Find the repeated groups: same units, collectives and checkpointed blocks."""

    def role(index: int) -> tuple[bool, bool]:
        return index >= 0, choice.is_checkpointed(index)

    runs = periodic_runs(
        [
            (key, tuple(role(index) for index, _ in group))
            for key, group in zip(layout.group_keys, layout.groups, strict=True)
        ]
    )

    def shape(g: int) -> GroupShape:
        units: dict[tuple, list] = {}
        for index, u in layout.groups[g]:
            units.setdefault((id(u), role(index)), [index, u, 0])[2] += 1
        reduces: dict[tuple[int, int], int] = {}
        for bucket in zip(layout.reduce_buckets[g], layout.reduce_launches[g], strict=True):
            reduces[bucket] = reduces.get(bucket, 0) + 1
        return GroupShape(
            g,
            tuple((index, u, count) for index, u, count in units.values()),
            tuple((params, launches, count) for (params, launches), count in reduces.items()),
        )

    patterns = tuple(tuple(shape(g) for g in range(run.start, run.start + run.period)) for run in runs)
    return RepeatedLayout(runs, patterns)


@dataclass(frozen=True, slots=True)
class TimeEstimate:
    step_time_s: float
    compute_s: float
    comm_s: float
    exposed_all_gather_s: float
    exposed_reduce_s: float
    optimizer_s: float
    overhead_s: float
    micro_batch_timeline: TimelineResult

    @property
    def exposed_comm_s(self) -> float:
        return self.exposed_all_gather_s + self.exposed_reduce_s


# ---------------------------------------------------------------- time


def block_step_time(
    params: CostParameters,
    block: UnitCost,
    *,
    tokens: int,
    act_bytes: int,
    checkpointing: str,
    compile_: bool,
) -> float:
    """Forward + backward (+ recompute) seconds of one block alone: what the profiler times."""
    fwd = _forward_time(params, act_bytes, block, tokens, compile_)
    probe = Choice("", 1, 1, 1, 0.0, 0.0, checkpointing, 1, 1, 1, compile_)
    return 3.0 * fwd.total + _recompute_time(probe, block, 0, fwd)


@dataclass(frozen=True, slots=True)
class ForwardTime:
    matmul: float
    attention: float
    elementwise: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.elementwise


def _forward_time(
    p: CostParameters, act_bytes: int, unit: UnitCost, tokens: int, compile_: bool
) -> ForwardTime:
    matmul = 2.0 * unit.matmul_params * tokens / (p.peak_flops * p.matmul_efficiency)
    matmul += unit.gemms * p.matmul_overhead_s
    attention = unit.attention_flops * tokens / (p.peak_flops * p.attention_efficiency)
    traffic = unit.elementwise_elems * tokens * act_bytes
    kernels = unit.kernels
    if compile_:
        traffic *= p.compile_traffic_fraction
        kernels *= p.compile_kernel_fraction
    elementwise = traffic / p.memory_bandwidth + kernels * p.kernel_overhead_s
    scale = p.compute_scale * (p.compiled_compute_scale if compile_ else 1.0)
    return ForwardTime(matmul * scale, attention * scale, elementwise * scale)


def _recompute_time(choice: Choice, unit: UnitCost, index: int, fwd: ForwardTime) -> float:
    """Forward work re-run in backward for a checkpointed (or op-selective) block."""
    if index < 0:
        return 0.0
    if choice.is_checkpointed(index):
        return fwd.total - (fwd.attention if compiled_keeps(choice, unit) else 0.0)
    if choice.checkpointing == "op_selective" and unit.matmul_params:
        # The unsaved matmuls and every elementwise op run again; attention output is saved.
        share = unit.op_recompute_matmul_params / unit.matmul_params
        return fwd.matmul * share + fwd.elementwise
    return 0.0


def _collective(
    p: CostParameters,
    link: LinkClass,
    nbytes: float,
    group: int,
    *,
    all_reduce: bool = False,
    launches: int = 1,
) -> float:
    """Seconds of `launches` collectives moving `nbytes` in all over a group of `group` ranks."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    lp = p.links[link]
    passes = 2.0 if all_reduce else 1.0
    volume = nbytes * (group - 1) / group * passes
    return lp.latency(group) * passes * launches + volume / lp.bandwidth


def _timing(
    setting: Setting, choice: Choice, layout: CommLayout, repeats: RepeatedLayout, *, record: bool
) -> TimeEstimate:
    """Step time from the two-stream timeline of one micro-batch, times accumulation.

    `repeats` (Estimator.repeats) says which groups repeat: each distinct group is priced once.
    """
    p = setting.params
    tokens = choice.micro_batch * setting.seq_len
    pb = setting.param_bytes
    shard, replicas = choice.shard_group, choice.replicate_group
    shard_link: LinkClass = "intra" if shard <= setting.gpus_per_node else "inter"
    replica_link: LinkClass = "inter" if setting.num_nodes > 1 else "intra"
    world_link: LinkClass = "inter" if setting.num_nodes > 1 else "intra"

    fwd_cache: dict[int, ForwardTime] = {}  # repeated blocks are one object: price it once

    def unit_forward(u: UnitCost) -> ForwardTime:
        key = id(u)
        if key not in fwd_cache:
            fwd_cache[key] = _forward_time(p, setting.act_bytes, u, tokens, choice.compile)
        return fwd_cache[key]

    def group_times(shape: GroupShape) -> tuple[GroupTimes, GroupTimes]:
        """One group in the last micro-batch, and in the earlier ones."""
        fwd = 0.0
        bwd = 0.0
        for index, u, count in shape.units:
            f = unit_forward(u)
            fwd += count * f.total
            bwd += count * (2.0 * f.total + _recompute_time(choice, u, index, f))
        ag = 0.0
        reduce = 0.0
        if choice.sharding != "no_shard":
            g = shape.group
            gathered = pb * layout.group_params[g]
            ag = _collective(p, shard_link, gathered, shard, launches=layout.group_launches[g])
            for params, launches, count in shape.reduces:
                reduce += count * _collective(p, shard_link, 4.0 * params, shard, launches=launches)
                if choice.sharding == "hybrid_shard":
                    reduce += count * _collective(
                        p, replica_link, 4.0 * params / shard, replicas, all_reduce=True, launches=launches
                    )
            sync_every_micro_batch = reduce
        else:
            for params, launches, count in shape.reduces:
                reduce += count * _collective(
                    p, world_link, 4.0 * params, setting.world_size, all_reduce=True, launches=launches
                )
            # Eager (FSDP2) replicas accumulate locally and all-reduce once per step; compiled
            # SimpleFSDP's all-reduce is part of every backward graph.
            sync_every_micro_batch = reduce if choice.compile else 0.0
        ag_bwd = ag if choice.reshards_after_forward else 0.0
        last = GroupTimes(fwd, bwd, ag, ag_bwd, reduce)
        return last, GroupTimes(fwd, bwd, ag, ag_bwd, sync_every_micro_batch)

    # Each run's pattern, priced from its first period's groups.
    priced = [[group_times(shape) for shape in pattern] for pattern in repeats.patterns]
    last = RepeatedGroups(repeats.runs, tuple(tuple(t[0] for t in pattern) for pattern in priced))
    middle = RepeatedGroups(repeats.runs, tuple(tuple(t[1] for t in pattern) for pattern in priced))

    contention = p.overlap_contention
    final = simulate(last, prefetch_depth=choice.prefetch_depth, contention=contention, record=record)
    if choice.grad_accum > 1 and choice.sharding == "no_shard" and not choice.compile:
        inner = simulate(middle, prefetch_depth=choice.prefetch_depth, contention=contention)
    else:
        inner = final
    accum_before = choice.grad_accum - 1

    local_params = setting.model.num_params / shard
    optimizer_s = p.optimizer_overhead_s + local_params * p.optimizer_bytes_per_param / p.memory_bandwidth
    optimizer_s += _collective(p, world_link, 4.0, setting.world_size, all_reduce=True)  # grad-norm
    sharded = choice.sharding != "no_shard"
    if choice.compile:
        per_micro_batch = p.compiled_overhead_s
    else:
        per_micro_batch = p.micro_batch_overhead_s + (p.sharding_overhead_s if sharded else 0.0)
    overhead_s = per_micro_batch * choice.grad_accum

    step = accum_before * inner.total_s + final.total_s + optimizer_s + overhead_s
    return TimeEstimate(
        step_time_s=step,
        compute_s=accum_before * inner.compute_s + final.compute_s + optimizer_s + overhead_s,
        comm_s=accum_before * inner.comm_s + final.comm_s,
        exposed_all_gather_s=accum_before * inner.exposed_all_gather_s + final.exposed_all_gather_s,
        exposed_reduce_s=accum_before * inner.exposed_reduce_s + final.exposed_reduce_s,
        optimizer_s=optimizer_s,
        overhead_s=overhead_s,
        micro_batch_timeline=final,
    )


class Estimator:
    """Prices many choices for one setting, caching what choices share (layouts, activations,
    repeated groups)."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self._layouts: dict[tuple, CommLayout] = {}
        self._saved: dict[tuple[str, int, bool], SavedActivations] = {}
        self._repeats: dict[tuple, RepeatedLayout] = {}

    def layout(self, choice: Choice) -> CommLayout:
        key = (
            1 if choice.compile else choice.blocks_per_unit,
            choice.compile,
            choice.all_gather_bucket_mb if choice.compile else 0.0,
            choice.reduce_scatter_bucket_mb if choice.compile else 0.0,
        )
        if key not in self._layouts:
            self._layouts[key] = comm_layout(self.setting, choice)
        return self._layouts[key]

    def moments(self, choice: Choice) -> tuple[MemoryEstimate, ...]:
        """Memory at the step's candidate peaks (planner/cost/memory.py)."""
        key = (choice.checkpointing, choice.every_k, choice.compile)
        if key not in self._saved:
            self._saved[key] = saved_activations(self.setting, *key)
        return memory_moments(self.setting, choice, self.layout(choice), self._saved[key])

    def memory(self, choice: Choice) -> MemoryEstimate:
        """The step's peak: the larger of its moments."""
        return max(self.moments(choice), key=lambda m: m.total)

    def repeats(self, choice: Choice) -> RepeatedLayout:
        """The layout's groups as repeated runs, checkpointing included (k-th-block checkpointing
        repeats with a longer period than the blocks themselves)."""
        layout = self.layout(choice)
        # Only k-th-block checkpointing treats blocks unalike (layouts live as long as self).
        key = (id(layout), choice.every_k if choice.checkpointing == "selective" else 0)
        if key not in self._repeats:
            self._repeats[key] = repeated_layout(layout, choice)
        return self._repeats[key]

    def timing(self, choice: Choice, *, record: bool = False) -> TimeEstimate:
        return _timing(self.setting, choice, self.layout(choice), self.repeats(choice), record=record)
