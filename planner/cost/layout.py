"""How a configuration's parameters map onto collectives: wrap units, buckets and launches.

Eager FSDP2 copies each wrap unit's parameters into one flat buffer: one all-gather and one
reduce-scatter per unit. Compiled SimpleFSDP gathers every parameter tensor on its own, and inductor
merges consecutive gathers (and reductions) into buckets up to the plan's caps; with a cap of 0 no
bucketing runs and each tensor is one collective. The compiled runtime never groups parameters by
wrap unit, so for compiled configurations `blocks_per_unit` changes nothing and the search keeps it
at 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from planner.cost.model_costs import UnitCost, float8_share
from planner.cost.setting import Choice, Setting

MB = 1e6

IndexedUnit = tuple[int, UnitCost]
"""A unit with its block index (-1 for the embedding and the head)."""


@dataclass(frozen=True, slots=True)
class CommLayout:
    """How units map onto collectives for one configuration.

    `groups` are all-gather groups in forward order: wrap units, merged (compiled only) into
    buckets up to the all-gather cap. `reduce_buckets[j]` lists the parameter counts of the
    gradient-reduction buckets whose last unit (in backward order) lies in group j: they are formed
    independently, over units in backward order, up to the reduce-scatter cap.
    """

    groups: tuple[tuple[IndexedUnit, ...], ...]
    reduce_buckets: tuple[tuple[int, ...], ...]
    group_gather_bytes: tuple[float, ...]
    """Bytes each all-gather group gathers per rank's shard group (compute-dtype parameters; the
    float8-converted weights at one byte when they are gathered in float8)."""
    model_gather_bytes: float
    """The same for the whole model (every group)."""
    group_launches: tuple[int, ...]
    """All-gather kernels per group (each pays the collective's latency)."""
    reduce_launches: tuple[tuple[int, ...], ...]
    """Reduction kernels per entry of `reduce_buckets`."""
    largest_reduce: int
    """Parameters of the largest gradient-reduction bucket."""
    block_group_gather_bytes: tuple[float, ...]
    """Gathered bytes of the groups that hold transformer blocks only (what backward recomputes)."""
    largest_block_reduce: int
    """Parameters of the largest gradient-reduction bucket completing in such a group."""
    signature: tuple
    """Equal for layouts that price identically (the search memoizes on it)."""
    group_idents: tuple[tuple[tuple[int, bool], ...], ...]
    """Each group's units by identity and role (block or not): what `group_keys` compares."""
    _windows: dict[tuple[bool, int], float] = field(default_factory=dict, compare=False, repr=False)
    _keys: list[tuple[int, ...]] = field(default_factory=list, compare=False, repr=False)

    @property
    def group_keys(self) -> tuple[int, ...]:
        """Equal for groups that price identically under a configuration that checkpoints every block
        alike: same units in the same roles, same collectives (what lets repeated blocks price once).
        Worked out when first asked: only the configurations the search times ask."""
        if not self._keys:
            self._keys.append(
                _group_keys(self.group_idents, self.reduce_buckets, self.group_launches, self.reduce_launches)
            )
        return self._keys[0]

    def largest_gather(self, width: int, *, blocks_only: bool) -> float:
        """The most bytes `width` consecutive all-gather groups gather (fewer at the start): what is
        gathered at once while a group computes with `width - 1` prefetched ahead of it; of every
        group, or of the block groups only (`block_group_gather_bytes`). Worked out once per layout:
        the search asks for it for every configuration sharing the layout."""
        key = (blocks_only, width)
        largest = self._windows.get(key)
        if largest is None:
            groups = self.block_group_gather_bytes if blocks_only else self.group_gather_bytes
            if width == 1:  # the windows' sums are the groups themselves (0.0 + x is x)
                largest = max(groups)
            else:
                largest = max(sum(groups[max(0, j - width + 1) : j + 1]) for j in range(len(groups)))
            self._windows[key] = largest
        return largest


def _wrap_units(setting: Setting, k: int) -> list[list[IndexedUnit]]:
    """The embedding, the blocks `k` to a unit, the head."""
    m = setting.model
    blocks = list(enumerate(m.blocks))
    units: list[list[IndexedUnit]] = [[(-1, m.embedding)]]
    units += [blocks[i : i + k] for i in range(0, len(blocks), k)]
    units.append([(-1, m.head)])
    return units


def _bucket(unit_params: list[int], cap_bytes: float, bytes_per_param: int) -> list[list[int]]:
    """Indices of consecutive units (`unit_params`: each one's parameters) merged while their total
    stays under the cap."""
    if cap_bytes <= 0:
        return [[index] for index in range(len(unit_params))]
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0.0
    for index, params in enumerate(unit_params):
        unit_bytes = params * bytes_per_param
        if current and current_bytes + unit_bytes > cap_bytes:
            buckets.append(current)
            current, current_bytes = [], 0.0
        current.append(index)
        current_bytes += unit_bytes
    buckets.append(current)
    return buckets


def _launches(
    unit_params: list[int],
    unit_tensors: list[int],
    indices: list[int],
    *,
    compile_: bool,
    cap_bytes: float,
    bytes_per_param: int,
) -> int:
    """Collective kernels a bucket of units takes (`unit_params`, `unit_tensors`: each unit's)."""
    if not compile_:
        return len(indices)  # FSDP2: one flat-buffer collective per wrap unit
    tensors = sum(unit_tensors[i] for i in indices)
    if cap_bytes <= 0:
        return tensors  # no bucketing: every parameter tensor is its own collective
    params = sum(unit_params[i] for i in indices)
    # A unit larger than the cap is split over several buckets.
    return max(1, min(tensors, math.ceil(params * bytes_per_param / cap_bytes)))


def _gathered_bytes(setting: Setting, choice: Choice) -> Callable[[UnitCost], float]:
    """Bytes a unit's parameters take gathered: the compute dtype, less a byte for each weight
    all-gathered in float8."""
    pb = setting.param_bytes
    if not choice.float8_all_gather:
        return lambda u: float(pb * u.num_params)
    return lambda u: pb * u.num_params - (pb - 1) * float8_share(u, choice.float8).params


def comm_layout(setting: Setting, choice: Choice) -> CommLayout:
    """Eager FSDP2 issues one all-gather and one reduce-scatter per wrap unit; compiled
    SimpleFSDP one per parameter tensor, merged by inductor into buckets up to the caps."""
    return LayoutBuilder(setting).layout(choice)


@dataclass(frozen=True, slots=True)
class _Units:
    """A setting's wrap units for one blocks-per-unit, with each unit's parameters and tensors."""

    units: list[list[IndexedUnit]]
    params: list[int]
    tensors: list[int]
    idents: list[tuple[tuple[int, bool], ...]]
    """Each unit's members by identity and role (block or not)."""
    blocks: list[bool]
    """Whether each unit holds transformer blocks only."""
    gathered: dict[str, list[list[float]]] = field(default_factory=dict)
    """Each unit's members' gathered bytes, by the float8 recipe gathered in (`_gathered_bytes`)."""


@dataclass(frozen=True, slots=True)
class _GatherSide:
    """What the all-gather cap (and float8 all-gathers) decide: the groups and their launches and
    bytes, and which group each unit lies in."""

    groups: tuple[tuple[IndexedUnit, ...], ...]
    group_of_unit: tuple[int, ...]
    launches: tuple[int, ...]
    gather_bytes: tuple[float, ...]
    block_groups: tuple[int, ...]
    sizes: tuple[int, ...]
    idents: tuple[tuple[tuple[int, bool], ...], ...]
    """Each group's units by identity and role (`_group_keys`)."""


class LayoutBuilder:
    """`comm_layout` for the choices of one setting (a tensor- and expert-parallel share), sharing
    what their layouts have in common: the search asks for every pair of bucket caps, and the
    gradient reductions' buckets do not depend on the all-gather cap, nor the all-gather groups on
    the reduce-scatter cap. Each part is worked out as `comm_layout` always did; only once."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting  # keeps the units alive: the group keys name them by identity
        self._units: dict[int, _Units] = {}
        self._gathers: dict[tuple, _GatherSide] = {}
        self._reduces: dict[tuple, tuple[tuple[int, int, int], ...]] = {}

    def layout(self, choice: Choice) -> CommLayout:
        compiled = choice.simple_fsdp
        units = self._wrap(1 if compiled else choice.blocks_per_unit)
        ag_cap = choice.all_gather_bucket_mb * MB if compiled else 0.0
        rs_cap = choice.reduce_scatter_bucket_mb * MB if compiled else 0.0
        gather = self._gather(units, choice, ag_cap)
        reduce: list[list[int]] = [[] for _ in gather.groups]
        reduce_launches: list[list[int]] = [[] for _ in gather.groups]
        for last_unit, params, launches in self._reduce(units, choice, rs_cap):
            group = gather.group_of_unit[last_unit]
            reduce[group].append(params)
            reduce_launches[group].append(launches)
        reduce_buckets = tuple(tuple(r) for r in reduce)
        launches = tuple(tuple(r) for r in reduce_launches)
        group_bytes = gather.gather_bytes
        largest_reduce = max(p for bucket in reduce_buckets for p in bucket)
        block_reduces = [p for j in gather.block_groups for p in reduce_buckets[j]]
        return CommLayout(
            groups=gather.groups,
            reduce_buckets=reduce_buckets,
            group_gather_bytes=group_bytes,
            model_gather_bytes=sum(group_bytes),
            group_launches=gather.launches,
            reduce_launches=launches,
            largest_reduce=largest_reduce,
            block_group_gather_bytes=tuple(group_bytes[j] for j in gather.block_groups) or group_bytes,
            largest_block_reduce=max(block_reduces, default=largest_reduce),
            signature=(gather.sizes, reduce_buckets, gather.launches, launches),
            group_idents=gather.idents,
        )

    def _wrap(self, blocks_per_unit: int) -> _Units:
        units = self._units.get(blocks_per_unit)
        if units is None:
            wrapped = _wrap_units(self.setting, blocks_per_unit)
            units = _Units(
                wrapped,
                [sum(u.num_params for _, u in unit) for unit in wrapped],
                [sum(u.tensors for _, u in unit) for unit in wrapped],
                [tuple((id(u), index >= 0) for index, u in unit) for unit in wrapped],
                [all(index >= 0 for index, _ in unit) for unit in wrapped],
            )
            self._units[blocks_per_unit] = units
        return units

    def _gather(self, units: _Units, choice: Choice, cap: float) -> _GatherSide:
        float8 = choice.float8 if choice.float8_all_gather else "none"
        key = (id(units), choice.simple_fsdp, cap, float8)
        side = self._gathers.get(key)
        if side is None:
            gathered = units.gathered.get(float8)
            if gathered is None:
                unit_bytes = _gathered_bytes(self.setting, choice)
                gathered = units.gathered[float8] = [[unit_bytes(u) for _, u in unit] for unit in units.units]
            if cap <= 0:
                side = self._gathers[key] = _unit_groups(units, gathered, compiled=choice.simple_fsdp)
                return side
            pb = self.setting.param_bytes
            buckets = _bucket(units.params, cap, pb)
            groups = tuple(tuple(x for i in bucket for x in units.units[i]) for bucket in buckets)
            side = _GatherSide(
                groups=groups,
                group_of_unit=tuple(g for g, bucket in enumerate(buckets) for _ in bucket),
                launches=tuple(
                    _launches(units.params, units.tensors, bucket, compile_=choice.simple_fsdp,
                              cap_bytes=cap, bytes_per_param=pb)
                    for bucket in buckets
                ),
                # Summed member by member in forward order, as a group's members are.
                gather_bytes=tuple(sum(b for i in bucket for b in gathered[i]) for bucket in buckets),
                block_groups=tuple(
                    j for j, bucket in enumerate(buckets) if all(units.blocks[i] for i in bucket)
                ),
                sizes=tuple(len(g) for g in groups),
                idents=tuple(
                    units.idents[bucket[0]] if len(bucket) == 1
                    else tuple(x for i in bucket for x in units.idents[i])
                    for bucket in buckets
                ),
            )
            self._gathers[key] = side
        return side

    def _reduce(self, units: _Units, choice: Choice, cap: float) -> tuple[tuple[int, int, int], ...]:
        """The gradient-reduction buckets, formed over the units in backward order: each one's last
        unit (in forward order: where in backward it completes), parameters and kernels."""
        key = (id(units), choice.simple_fsdp, cap, choice.reduce_bytes)
        side = self._reduces.get(key)
        if side is None:
            reversed_params, reversed_tensors = units.params[::-1], units.tensors[::-1]
            last = len(units.params) - 1
            if cap <= 0:  # a bucket per unit: its tensors (compiled) or its flat buffer (eager)
                launches = reversed_tensors if choice.simple_fsdp else [1] * len(reversed_params)
                side = self._reduces[key] = tuple(
                    (last - j, params, launches[j]) for j, params in enumerate(reversed_params)
                )
                return side
            side = tuple(
                (
                    last - bucket[-1],  # in backward order the bucket completes here
                    sum(reversed_params[i] for i in bucket),
                    _launches(
                        reversed_params, reversed_tensors, bucket, compile_=choice.simple_fsdp,
                        cap_bytes=cap, bytes_per_param=choice.reduce_bytes,
                    ),
                )
                for bucket in _bucket(reversed_params, cap, 4)
            )
            self._reduces[key] = side
        return side


def _unit_groups(units: _Units, gathered: list[list[float]], *, compiled: bool) -> _GatherSide:
    """The all-gather groups without bucketing (eager FSDP2, or a cap of 0): a group per wrap unit,
    gathered in one flat buffer (eager) or tensor by tensor (compiled), as `_bucket` and `_launches`
    would have them."""
    return _GatherSide(
        groups=tuple(tuple(unit) for unit in units.units),
        group_of_unit=tuple(range(len(units.units))),
        launches=tuple(units.tensors) if compiled else (1,) * len(units.units),
        gather_bytes=tuple(sum(members) for members in gathered),
        block_groups=tuple(j for j, blocks in enumerate(units.blocks) if blocks),
        sizes=tuple(len(unit) for unit in units.units),
        idents=tuple(units.idents),
    )


def _group_keys(
    idents: tuple[tuple[tuple[int, bool], ...], ...],
    reduce_buckets: tuple[tuple[int, ...], ...],
    group_launches: tuple[int, ...],
    reduce_launches: tuple[tuple[int, ...], ...],
) -> tuple[int, ...]:
    ids: dict[tuple, int] = {}
    keys = []
    for ident, reduces, launches, reduce_launch in zip(
        idents, reduce_buckets, group_launches, reduce_launches, strict=True
    ):
        # Units by identity: the model's repeated blocks are one object (planner/cost/model_costs.py).
        content = (ident, reduces, launches, reduce_launch)
        keys.append(ids.setdefault(content, len(ids)))
    return tuple(keys)
