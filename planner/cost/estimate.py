"""Predict step time and peak memory of one parallel configuration.

`Estimator.memory()` (planner/cost/memory.py) is cheap and runs first so that search can prune by
memory before paying for the timeline in `Estimator.timing()`; both share the configuration's
collective layout (planner/cost/layout.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from contract.mesh import LinkClass
from contract.topology import domains_spanned
from planner.cost.expert_dispatch import dispatch_bytes_per_token
from planner.cost.gemm import attention_scale, matmul_seconds
from planner.cost.layout import CommLayout, LayoutBuilder
from planner.cost.memory import (
    MemoryEstimate,
    SavedActivations,
    compiled_keeps,
    fits_in_memory,
    memory_moments,
    saved_activations,
    sharded_states,
)
from planner.cost.model_costs import (
    UnitCost,
    context_parallel_share,
    expert_parallel_share,
    float8_share,
    pipeline_rank_share,
    tensor_parallel_share,
)
from planner.cost.parameters import FLOAT8_CAST_BYTES_PER_ELEMENT, GIB, CostParameters
from planner.cost.pipeline import (
    BoundaryTensors,
    ChunkTimes,
    boundary_tensors,
    bubble_seconds,
    in_flight_chunks,
)
from planner.cost.repeats import Run, periodic_runs
from planner.cost.setting import Choice, Setting
from planner.cost.timeline import CommFloor, GroupTimes, RepeatedGroups, TimelineResult, simulate


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
    tensor_parallel_s: float = 0.0
    """Tensor-parallel collectives per step: on the compute stream's path, so all exposed (in
    `comm_s`, not in `compute_s`)."""
    pipeline_bubble_s: float = 0.0
    """Time the busiest pipeline rank waits per step while the schedule fills and drains."""
    pipeline_p2p_s: float = 0.0
    """The pipeline's point-to-point sends per step on the critical path (in `comm_s` too)."""
    expert_parallel_s: float = 0.0
    """Expert-parallel all-to-alls (token dispatch and combine) per step: on the compute stream's
    path like the tensor-parallel collectives, all exposed, and counted apart from them."""

    @property
    def exposed_comm_s(self) -> float:
        model_parallel = self.tensor_parallel_s + self.expert_parallel_s
        collectives = self.exposed_all_gather_s + self.exposed_reduce_s + model_parallel
        return collectives + self.pipeline_p2p_s


# ---------------------------------------------------------------- time

BACKWARD_FLOPS_RATIO = 2.0
"""Backward does twice the forward's work: each matmul's gradient w.r.t. its input and its weight."""
ATTENTION_BACKWARD_EXTRA = 0.5
"""Flash attention's backward recomputes the attention scores from q and k (it never stored them):
five matmuls to the forward's two, 2.5x the forward's FLOPs where other matmuls take 2x."""


def block_step_time(
    params: CostParameters,
    block: UnitCost,
    *,
    tokens: int,
    seq_len: int,
    act_bytes: int,
    checkpointing: str,
    compile_: bool,
) -> float:
    """Forward + backward (+ recompute) seconds of one block alone over `tokens` tokens of sequences
    of `seq_len`: what the profiler times."""
    fwd = _forward_time(params, act_bytes, block, tokens, compile_, seq_len=seq_len)
    probe = Choice(sharding="", checkpointing=checkpointing, compile=compile_)
    backward = BACKWARD_FLOPS_RATIO * fwd.total + ATTENTION_BACKWARD_EXTRA * fwd.attention
    return fwd.total + backward + _recompute_time(probe, block, 0, fwd)


@dataclass(frozen=True, slots=True)
class ForwardTime:
    matmul: float
    attention: float
    elementwise: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.elementwise


def _forward_time(
    p: CostParameters,
    act_bytes: int,
    unit: UnitCost,
    tokens: int,
    compile_: bool,
    float8: str = "none",
    *,
    seq_len: int,
    whole_sequence_casts: bool = False,
) -> ForwardTime:
    """One forward of `unit` over `tokens` tokens (a rank's) of sequences `seq_len` long (whole: what
    attention's keys span)."""
    # The GEMMs at their shapes (planner/cost/gemm.py), in the compute dtype.
    matmul = matmul_seconds(p, unit, tokens, dtype_bytes=act_bytes)
    fp8 = None
    if float8 != "none":
        fp8 = float8_share(unit, float8, compiled=compile_, whole_sequence_casts=whole_sequence_casts)
    casts = 0.0
    if fp8 is not None and fp8.matmul_fraction:
        # The converted share runs at the float8 peak's multiple of the bf16 rate the shapes reach.
        speedup = p.fp8_peak_flops * p.float8_gemm_efficiency[float8] / p.peak_flops
        matmul *= 1.0 - fp8.matmul_fraction + fp8.matmul_fraction / speedup
        # A third of the casts happen in forward (the input and the weight), two thirds in backward
        # (the output gradient and the transposed copies): forward carries a third, and backward's
        # 2x of forward the rest.
        cast_bytes = FLOAT8_CAST_BYTES_PER_ELEMENT[(float8, compile_)]
        casts = (fp8.cast_elems * tokens + fp8.weight_elems) * cast_bytes / 3.0 / p.memory_bandwidth
    attention = 0.0
    if unit.attention_flops:
        efficiency = p.attention_efficiency * attention_scale(p, seq_len)
        attention = unit.attention_flops * tokens / (p.peak_flops * efficiency)
    traffic = unit.elementwise_elems * tokens * act_bytes
    kernels = unit.kernels
    if compile_:
        traffic *= p.compile_traffic_fraction
        kernels *= p.compile_kernel_fraction
    elementwise = traffic / p.memory_bandwidth + kernels * p.kernel_overhead_s + casts
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
    rails: int = 1,
) -> float:
    """Seconds of `launches` collectives moving `nbytes` in all over a group of `group` ranks.

    Across nodes, `rails` is how many of the group's ranks share a node: NCCL runs one ring per
    rank's network card, each carrying a share of the data and each node's NVLink carrying every
    ring, so the bandwidth is the cards' together, up to the NVLink's.
    """
    if group <= 1 or nbytes <= 0:
        return 0.0
    lp = p.links[link]
    passes = 2.0 if all_reduce else 1.0
    volume = nbytes * (group - 1) / group * passes
    bandwidth = lp.bandwidth
    if link == "inter" and rails > 1:
        bandwidth = min(p.links["intra"].bandwidth, lp.bandwidth * rails)
    return lp.latency(group) * passes * launches + volume / bandwidth


def tensor_parallel_seconds(
    p: CostParameters, unit: UnitCost, *, tokens: int, act_bytes: int, tp: int
) -> float:
    """One forward's tensor-parallel collectives of a unit (backward runs their mirror images).

    They sit between a unit's matmuls on the compute stream's critical path, on the node's own
    links (a tp group is consecutive ranks in one node): priced as exposed, never overlapped.
    """
    nbytes = unit.tp_collective_elems * tokens * act_bytes
    return _collective(p, "intra", nbytes, tp, launches=unit.tp_collectives)


def context_parallel_seconds(setting: Setting, choice: Choice, unit: UnitCost, *, tokens: int) -> float:
    """One forward's context-parallel all-gather of a block's keys and values over the cp group
    (backward reduce-scatters their gradients, its mirror image): the rank's `tokens` of them from
    each of the cp ranks. Priced as exposed, like the tensor-parallel collectives: attention waits
    for the whole sequence's keys (Llama 3's all-gather context parallelism; a ring would overlap)."""
    cp = choice.mesh.cp
    if cp == 1 or not unit.kv_elems:
        return 0.0
    nbytes = unit.kv_elems * tokens * cp * setting.act_bytes
    link = choice.mesh.context_link(setting.domain_gpus)
    rails = max(1, min(cp, setting.domain_gpus // choice.mesh.tp))
    return _collective(setting.params, link, nbytes, cp, rails=rails)


def expert_parallel_seconds(setting: Setting, choice: Choice, unit: UnitCost, *, tokens: int) -> float:
    """One forward's expert-parallel all-to-alls of an MoE block: the dispatch, each of the rank's
    `tokens` sent to its experts' ranks, and the combine, the experts' outputs sent back (backward
    runs their mirror images: the same two). What one token sends is
    planner/cost/expert_dispatch.py's: top-k copies of its hidden state (`copies`), or one per rank
    and one per node its experts sit on (`deduplicated`, DeepEP-class kernels). Of each rank's send
    buffer the (ep - 1) / ep not bound for its own experts crosses the links the group spans
    (`Mesh.expert_link`: NVLink while ep x tp ranks tile a scale-up domain, else the network), priced like the
    other collectives (`_collective`: latency plus the bytes leaving the rank over the bandwidth);
    deduplicated across nodes, the network carries one copy per node while NVLink fans them out,
    the two pipelined (the slower sets the pace). Exposed, like the tensor-parallel collectives: the
    experts' GEMMs wait for their rows, and the combine for the GEMMs (torchtitan overlaps neither)."""
    ep = choice.mesh.ep
    if ep == 1 or not unit.routed_experts or not unit.expert_shapes:
        return 0.0
    p = setting.params
    sent = functools.partial(
        dispatch_bytes_per_token,
        hidden=unit.expert_shapes[0][0],  # an expert's first linear reads the hidden state
        act_bytes=setting.act_bytes,
        experts=unit.routed_experts * ep,  # the rank's share holds num_experts / ep of them
        top_k=unit.experts_per_token,
        dispatch=p.expert_dispatch,
        placement=p.expert_placement,
    )
    link = choice.mesh.expert_link(setting.domain_gpus)
    if p.expert_dispatch == "copies" or link == "intra":
        return 2 * _collective(p, link, tokens * sent(groups=ep), ep)
    nodes = domains_spanned(choice.mesh.expert_span, domain=setting.domain_gpus)
    nvlink = _collective(p, "intra", tokens * sent(groups=ep), ep)
    network = _collective(p, "inter", tokens * sent(groups=nodes), nodes)
    return 2 * max(nvlink, network)


def async_tensor_parallel_seconds(comm_s: float, matmul_s: float, *, tp: int, contention: float) -> float:
    """What a block's tensor-parallel collectives still cost under async TP (inductor's
    micro-pipelining): each collective is cut into `tp` per-rank pieces, and while one piece moves
    the matmul runs on the piece before it. The first piece waits in front (1/tp of the transfer);
    the rest overlaps the block's matmuls (which the all-gathers feed and the reduce-scatters
    drain), exposed only where it outlasts them, and slows them by the contention of running beside
    them (shared SMs and memory, as for FSDP's overlap)."""
    rest = comm_s * (tp - 1) / tp
    hidden = min(rest, matmul_s * (tp - 1) / tp)
    return comm_s / tp + (rest - hidden) + contention * hidden


def async_tensor_parallel_step(
    comm_s: float, matmul_s: float, *, unit: UnitCost, tp: int, contention: float
) -> tuple[float, float]:
    """(forward, backward) seconds of a block's tensor-parallel collectives under async TP, from
    their unpipelined `comm_s` per pass. Inductor's micro-pipelining fuses an all-gather with the
    matmuls it feeds and a reduce-scatter with the one matmul whose output it scatters: every
    collective of the forward (and of its recompute), but in backward only the all-gathers (the
    gradients flowing back into the row-parallel matmuls); the reduce-scatters of the input
    gradients of the column-parallel matmuls scatter a sum of several matmuls' outputs (q, k and v;
    the MLP's gate and up projections), which it leaves unfused and exposed."""
    pipelined = async_tensor_parallel_seconds(comm_s, matmul_s, tp=tp, contention=contention)
    scattered_back = unit.gathered_elems / unit.tp_collective_elems if unit.tp_collective_elems else 0.0
    return pipelined, pipelined * (1.0 - scattered_back) + comm_s * scattered_back


@dataclass(frozen=True, slots=True)
class PricedStep:
    """One configuration's groups priced, before the timeline places them (Estimator.price)."""

    last: RepeatedGroups
    """Every group's times in the last micro-batch."""
    middle: RepeatedGroups
    """The same in the earlier micro-batches (eager no_shard syncs only in the last, and so does
    eager FSDP2 under a pipeline)."""
    tensor_parallel_s: float
    """Tensor-parallel collectives per micro-batch (inside the groups' compute)."""
    expert_parallel_s: float
    """Expert-parallel all-to-alls per micro-batch (inside the groups' compute too)."""
    optimizer_s: float
    overhead_s: float
    """Framework time per step outside the priced kernels."""


@dataclass(frozen=True, slots=True)
class Collectives:
    """A configuration's FSDP collectives, group by group (`GroupTimes` without compute), in the
    step's last micro-batch and in the earlier ones (the same object where they are alike)."""

    last: RepeatedGroups
    middle: RepeatedGroups


def _routed_expert_share(shape: GroupShape) -> float:
    """Of a group's parameters (the rank's expert-parallel share), the routed experts'."""
    params = sum(count * u.num_params for _, u, count in shape.units)
    return sum(count * u.expert_params for _, u, count in shape.units) / params if params else 0.0


def _collectives(
    setting: Setting, choice: Choice, layout: CommLayout, repeats: RepeatedLayout
) -> Collectives:
    """Every distinct group's all-gathers and reductions on the choice's mesh.

    `setting` is the rank's tensor-parallel share (Estimator.setting_for); `repeats`
    (Estimator.repeats) says which groups repeat: each distinct group is priced once.
    """
    p = setting.params
    mesh = choice.mesh
    rb = choice.reduce_bytes
    shard, replicas = mesh.fsdp_shards, mesh.dp_replicate  # FSDP shards over dp_shard x cp
    shard_link: LinkClass = mesh.shard_link(setting.domain_gpus)
    # Replicas are the outermost axis: their groups span the whole cluster.
    replica_link = world_link = mesh.pipeline_link(setting.domain_gpus)

    # Ranks of each group on one node (the mesh is replicas x shards x cp x tp, tp innermost; FSDP's
    # shard group is dp_shard x cp).
    per_node = setting.domain_gpus  # each GPU of a domain has its own NIC: a rail
    shard_rails = max(1, min(shard, per_node // mesh.tp))
    replica_rails = max(1, per_node // (shard * mesh.tp))
    world_rails = max(1, per_node // mesh.tp)
    replicated = mesh.dp * mesh.cp  # no_shard's all-reduce group: every rank of one tp position
    # The routed experts' own shard group (Mesh.expert_shards ranks at a stride of ep x tp): a domain
    # holds domain // (ep x tp) of them, each with its own card; inside one domain where they all fit.
    expert_rails = max(1, per_node // mesh.expert_span)
    expert_link: LinkClass = "intra" if mesh.expert_shards <= expert_rails else shard_link

    def sharded(nbytes: float, launches: int, expert: float) -> float:
        """An FSDP collective of `nbytes` over the shard group, less their `expert` share: the routed
        experts' are sharded over their own group (none at all where ep takes every shard rank)."""
        dense = _collective(p, shard_link, nbytes * (1 - expert), shard, launches=launches, rails=shard_rails)
        group, rails = mesh.expert_shards, expert_rails
        return dense + _collective(p, expert_link, nbytes * expert, group, launches=launches, rails=rails)

    def group_collectives(shape: GroupShape) -> tuple[GroupTimes, GroupTimes]:
        """One group's collectives in the last micro-batch, and in the earlier ones."""
        ag = 0.0
        reduce = 0.0
        if choice.sharding != "no_shard":
            g = shape.group
            gathered = layout.group_gather_bytes[g]
            expert = _routed_expert_share(shape) if mesh.ep > 1 else 0.0
            ag = sharded(gathered, layout.group_launches[g], expert)
            for params, launches, count in shape.reduces:
                reduce += count * sharded(rb * params, launches, expert)
                if choice.sharding == "hybrid_shard":
                    reduce += count * _collective(
                        p, replica_link, rb * params / shard, replicas, all_reduce=True, launches=launches,
                        rails=replica_rails,
                    )
            sync_every_micro_batch = reduce
            if choice.fsdp2_pipeline:
                # Torch's pipeline stages keep FSDP2's parameters gathered after a backward and
                # reduce once, after the last: the earlier micro-batches gather only what forward
                # resharded, for their backward.
                ag_bwd = ag if choice.reshards_after_forward else 0.0
                return GroupTimes(0.0, 0.0, ag, ag_bwd, reduce), GroupTimes(0.0, 0.0, 0.0, ag_bwd, 0.0)
        else:
            for params, launches, count in shape.reduces:
                reduce += count * _collective(
                    p, world_link, rb * params, replicated, all_reduce=True, launches=launches,
                    rails=world_rails,
                )
            # Eager (FSDP2) replicas accumulate locally and all-reduce once per step; compiled
            # SimpleFSDP's all-reduce is part of every backward graph.
            sync_every_micro_batch = reduce if choice.simple_fsdp else 0.0
        ag_bwd = ag if choice.reshards_after_forward else 0.0
        middle = GroupTimes(0.0, 0.0, ag, ag_bwd, sync_every_micro_batch)
        return GroupTimes(0.0, 0.0, ag, ag_bwd, reduce), middle

    # Each run's pattern, priced from its first period's groups.
    priced = [[group_collectives(shape) for shape in pattern] for pattern in repeats.patterns]
    last = RepeatedGroups(repeats.runs, tuple(tuple(t[0] for t in pattern) for pattern in priced))
    if all(t[0] == t[1] for pattern in priced for t in pattern):
        return Collectives(last, last)  # the same object: priced once
    middle = RepeatedGroups(repeats.runs, tuple(tuple(t[1] for t in pattern) for pattern in priced))
    return Collectives(last, middle)


def _price(
    setting: Setting,
    choice: Choice,
    collectives: Collectives,
    repeats: RepeatedLayout,
    unit_times: _UnitTimes,
) -> PricedStep:
    """Every group's compute (`unit_times`, for the choice's `compute_key`) beside its
    `collectives`, once per distinct group, plus the optimizer step."""

    def with_compute(shape: GroupShape, comm: GroupTimes) -> GroupTimes:
        fwd = bwd = 0.0
        for index, u, count in shape.units:
            f, b, *_ = unit_times(index, u)
            fwd += count * f
            bwd += count * b
        return GroupTimes(fwd, bwd, comm.all_gather_forward, comm.all_gather_backward, comm.reduce)

    def priced(groups: RepeatedGroups) -> RepeatedGroups:
        return RepeatedGroups(
            repeats.runs,
            tuple(
                tuple(with_compute(shape, comm) for shape, comm in zip(shapes, comms, strict=True))
                for shapes, comms in zip(repeats.patterns, groups.patterns, strict=True)
            ),
        )

    tp_per_micro_batch = ep_per_micro_batch = 0.0
    for run, pattern in zip(repeats.runs, repeats.patterns, strict=True):
        for shape in pattern:
            for index, u, count in shape.units:
                _, _, tp_s, ep_s = unit_times(index, u)
                tp_per_micro_batch += run.repeats * count * tp_s
                ep_per_micro_batch += run.repeats * count * ep_s
    optimizer_s, overhead_s = _outside_the_timeline(setting, choice)
    last = priced(collectives.last)
    return PricedStep(
        last=last,
        middle=last if collectives.middle is collectives.last else priced(collectives.middle),
        tensor_parallel_s=tp_per_micro_batch,
        expert_parallel_s=ep_per_micro_batch,
        optimizer_s=optimizer_s,
        overhead_s=overhead_s,
    )


class _UnitTimes:
    """(forward, backward, tensor- and context-parallel collectives, expert-parallel all-to-alls)
    seconds of one unit in one micro-batch, backward with its recompute; forward and backward
    include the collectives, which sit on the compute stream. Repeated blocks are one object:
    priced once. The times depend on the choice's `compute_key` only, so choices that share it
    may share one of these."""

    def __init__(self, setting: Setting, choice: Choice) -> None:
        self.setting = setting
        self.choice = choice
        self.tokens = choice.micro_batch_size * setting.seq_len
        # (forward, forward tp s, backward tp s, cp s, ep s)
        self._forward: dict[int, tuple[ForwardTime, float, float, float, float]] = {}
        self._times: dict[tuple[int, int], tuple[float, float, float, float]] = {}  # (role, unit id)

    def __call__(self, index: int, u: UnitCost) -> tuple[float, float, float, float]:
        # A unit's times depend on its index only through whether it is an end (embedding, head)
        # or a block recomputed whole: identical blocks alike in that are priced once.
        key = (-1 if index < 0 else int(self.choice.is_checkpointed(index)), id(u))
        if key not in self._times:
            self._times[key] = self._unit(index, u)
        return self._times[key]

    def _unit(self, index: int, u: UnitCost) -> tuple[float, float, float, float]:
        setting, choice = self.setting, self.choice
        if id(u) not in self._forward:
            tp = choice.mesh.tp
            tp_s = 0.0
            if tp > 1:
                tp_s = tensor_parallel_seconds(
                    setting.params, u, tokens=self.tokens, act_bytes=setting.act_bytes, tp=tp
                )
            forward = _forward_time(
                setting.params, setting.act_bytes, u, self.tokens, choice.compile, choice.float8,
                seq_len=setting.model.seq_len, whole_sequence_casts=choice.float8_casts_whole_sequence,
            )
            tp_back_s = tp_s
            if choice.async_tp and u.is_block:
                tp_s, tp_back_s = async_tensor_parallel_step(
                    tp_s, forward.matmul, unit=u, tp=tp, contention=setting.params.overlap_contention
                )
            cp_s = context_parallel_seconds(setting, choice, u, tokens=self.tokens)
            ep_s = 0.0
            if choice.mesh.ep > 1:  # exposed beside the cp all-gathers, and recomputed alike
                ep_s = expert_parallel_seconds(setting, choice, u, tokens=self.tokens)
            self._forward[id(u)] = (forward, tp_s, tp_back_s, cp_s, ep_s)
        f, tp_s, tp_back_s, cp_s, ep_s = self._forward[id(u)]
        tp_fwd = tp_s + cp_s
        tp_unit = tp_fwd + tp_back_s + cp_s + _recomputed_collectives(choice, u, index, tp_s=tp_s, cp_s=cp_s)
        # The all-to-alls run once forward, once backward (the transposed exchange) and again where
        # the block is recomputed whole, on every engine (the runtime's whole-block policies keep the
        # FSDP and tensor-parallel collectives' outputs, not the token exchange's; op-level
        # checkpointing keeps them instead); reported apart from tp's.
        ep_again = 0.0
        if choice.checkpointing != "op_selective" and index >= 0 and choice.is_checkpointed(index):
            ep_again = ep_s
        ep_unit = 2 * ep_s + ep_again
        backward = BACKWARD_FLOPS_RATIO * f.total + ATTENTION_BACKWARD_EXTRA * f.attention
        backward += _recompute_time(choice, u, index, f) + tp_unit - tp_fwd + ep_unit - ep_s
        return f.total + tp_fwd + ep_s, backward, tp_unit, ep_unit


def _recomputed_collectives(
    choice: Choice, unit: UnitCost, index: int, *, tp_s: float, cp_s: float
) -> float:
    """The forward's tensor- and context-parallel collectives a checkpointed block runs again in
    backward: all of them when the whole block is recomputed eagerly; under a policy that keeps
    what collectives produced (`Choice.checkpoint_policy_saves_communication`), the all-gathers
    only, or none when those are kept too."""
    if index < 0 or not (choice.is_checkpointed(index) or choice.checkpointing == "op_selective"):
        return 0.0
    if not choice.checkpoint_policy_saves_communication:
        return tp_s + cp_s
    if choice.checkpoint_saves_gathers:
        return 0.0
    gathered = unit.gathered_elems / unit.tp_collective_elems if unit.tp_collective_elems else 0.0
    return tp_s * gathered + cp_s


def _micro_batch_compute(setting: Setting, choice: Choice) -> float:
    """The compute stream's work for one micro-batch: every unit's forward and backward."""
    m = setting.model
    unit_times = _UnitTimes(setting, choice)
    indexed = [(-1, m.embedding), *enumerate(m.blocks), (-1, m.head)]
    return sum(f + b for f, b, *_ in (unit_times(i, u) for i, u in indexed))


def chunk_times(
    parts: tuple[float, float, float], choice: Choice, busy_per_micro_batch_s: float
) -> ChunkTimes:
    """One micro-batch through one of a pipeline rank's stages, split as zero-bubble schedules run
    it (`parts`: `compute_split`), scaled to the rank's busy time per micro-batch (its collectives'
    exposure included)."""
    forward, input_grad, weight_grad = parts
    total = forward + input_grad + weight_grad
    assert choice.pipeline is not None
    scale = busy_per_micro_batch_s / choice.pipeline.stages_per_rank / total if total else 0.0
    return ChunkTimes(forward * scale, input_grad * scale, weight_grad * scale)


def compute_split(setting: Setting, choice: Choice) -> tuple[float, float, float]:
    """A micro-batch's compute split as zero-bubble schedules run it: forward, the input gradient
    (with recompute) and the weight gradient (the GEMMs of the weights' gradients: as many FLOPs as
    forward's)."""
    m = setting.model
    unit_times = _UnitTimes(setting, choice)
    tokens = choice.micro_batch_size * setting.seq_len
    forward = backward = weight = 0.0
    for index, u in [(-1, m.embedding), *enumerate(m.blocks), (-1, m.head)]:
        f, b, *_ = unit_times(index, u)
        forward += f
        backward += b
        p = setting.params
        weight += _forward_time(
            p, setting.act_bytes, u, tokens, choice.compile, choice.float8, seq_len=m.seq_len
        ).matmul
    return forward, backward - weight, weight


def point_to_point_seconds(setting: Setting, choice: Choice) -> float:
    """One send of a micro-batch's activations (or their gradients) between neighbouring stages:
    each rank sends its own share (1/tp of the sequence under sequence parallelism, 1/cp under
    context parallelism) over the link between the stages' nodes. `setting` is the whole model's
    tensor- and context-parallel share (`Estimator.setting_for`), whose head reads the hidden size."""
    p, mesh = setting.params, choice.mesh
    hidden = setting.model.head.input_elems  # the hidden size: what a block hands the next
    nbytes = choice.micro_batch_size * setting.seq_len * hidden * setting.act_bytes / mesh.tp
    link = p.links[mesh.pipeline_link(setting.domain_gpus)]
    return link.latency(2) + nbytes / link.bandwidth


def pipeline_exposed_p2p(chunk: ChunkTimes, send_s: float, choice: Choice) -> float:
    """The sends on the critical path per step: one per hop while the pipeline fills and one per
    hop while it drains (pp - 1 hops each, per virtual stage), and in the steady state whatever a
    send takes beyond the chunk's compute it overlaps (the next forward or backward)."""
    assert choice.pipeline is not None
    pp, v, m = choice.mesh.pp, choice.pipeline.stages_per_rank, choice.grad_accum_steps
    fill_drain = 2 * (pp - 1) * v * send_s
    backward = chunk.input_grad + chunk.weight_grad
    steady = m * v * (max(0.0, send_s - chunk.forward) + max(0.0, send_s - backward))
    return fill_drain + steady


def _outside_the_timeline(setting: Setting, choice: Choice) -> tuple[float, float]:
    """(optimizer step, framework overhead) seconds per step: around the micro-batches' timeline."""
    p = setting.params
    world_link = choice.mesh.pipeline_link(setting.domain_gpus)  # the whole cluster's span
    local_params = setting.model.rank_params / choice.mesh.fsdp_shards
    # The update reads and writes the parameters, gradients and states in their dtype (the traffic
    # per parameter is priced for fp32: pure bf16 moves half of it).
    traffic = p.optimizer_bytes_per_param * setting.state_bytes / 4
    optimizer_s = p.optimizer_overhead_s + local_params * traffic / p.memory_bandwidth
    optimizer_s += _collective(p, world_link, 4.0, setting.world_size, all_reduce=True)  # grad-norm
    sharded = choice.sharding != "no_shard"
    if choice.simple_fsdp:
        per_micro_batch = p.compiled_overhead_s
    else:
        per_micro_batch = p.micro_batch_overhead_s + (p.sharding_overhead_s if sharded else 0.0)
    return optimizer_s, per_micro_batch * choice.grad_accum_steps


def _syncs_in_last_only(choice: Choice) -> bool:
    """Whether the step's earlier micro-batches run `PricedStep.middle` (no gradient sync: eager
    no_shard, and eager FSDP2 under a pipeline) rather than the last one's groups."""
    eager_no_shard = choice.sharding == "no_shard" and not choice.simple_fsdp
    return choice.grad_accum_steps > 1 and (eager_no_shard or choice.fsdp2_pipeline)


def _timing(priced: PricedStep, choice: Choice, contention: float, *, record: bool) -> TimeEstimate:
    """Step time from the two-stream timeline of one micro-batch, times accumulation."""
    final = simulate(priced.last, prefetch_depth=choice.prefetch_depth, contention=contention, record=record)
    if _syncs_in_last_only(choice):
        inner = simulate(priced.middle, prefetch_depth=choice.prefetch_depth, contention=contention)
    else:
        inner = final
    accum_before = choice.grad_accum_steps - 1
    optimizer_s, overhead_s = priced.optimizer_s, priced.overhead_s
    tp_comm_s = priced.tensor_parallel_s * choice.grad_accum_steps
    ep_comm_s = priced.expert_parallel_s * choice.grad_accum_steps
    step = accum_before * inner.total_s + final.total_s + optimizer_s + overhead_s
    compute_s = accum_before * inner.compute_s + final.compute_s + optimizer_s + overhead_s
    return TimeEstimate(
        step_time_s=step,
        compute_s=compute_s - tp_comm_s - ep_comm_s,
        comm_s=accum_before * inner.comm_s + final.comm_s + tp_comm_s + ep_comm_s,
        exposed_all_gather_s=accum_before * inner.exposed_all_gather_s + final.exposed_all_gather_s,
        exposed_reduce_s=accum_before * inner.exposed_reduce_s + final.exposed_reduce_s,
        optimizer_s=optimizer_s,
        overhead_s=overhead_s,
        micro_batch_timeline=final,
        tensor_parallel_s=tp_comm_s,
        expert_parallel_s=ep_comm_s,
    )


def _total(memory: MemoryEstimate) -> float:
    return memory.total


def _peak(moments: tuple[MemoryEstimate, ...]) -> float:
    return max(m.total for m in moments)


class Estimator:
    """Prices many choices for one setting, caching what choices share (tensor-parallel shares,
    layouts, activations, repeated groups); every cache is keyed by the choice's own keys."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self._shares: dict[tuple[int, int, int], Setting] = {(1, 1, 1): setting}
        self._layouts: dict[tuple, CommLayout] = {}
        self._builders: dict[tuple[int, int], LayoutBuilder] = {}  # by (tp, ep) share
        self._moments: dict[Choice, tuple[MemoryEstimate, ...]] = {}
        self._partial: dict[Choice, list[tuple[MemoryEstimate, ...]]] = {}
        self._saved: dict[tuple, SavedActivations] = {}
        self._repeats: dict[tuple, RepeatedLayout] = {}
        self._compute: dict[tuple, float] = {}
        self._stages: dict[tuple, Estimator] = {}
        self._compute_splits: dict[tuple, tuple[float, float, float]] = {}
        self._pipelines: dict[tuple, tuple[PipelineRank, ...]] = {}
        self._unit_times: dict[tuple, _UnitTimes] = {}
        self._collectives: dict[tuple, Collectives] = {}
        self._floors: dict[tuple, tuple[CommFloor, CommFloor]] = {}
        self._signatures: dict[tuple, int] = {}
        self._signature_numbers: dict[tuple, int] = {}  # by layout key

    def pipeline_ranks(self, choice: Choice) -> tuple[PipelineRank, ...]:
        """The pipeline's ranks that can peak or be the slowest, each priced as a model of its own
        (its stages' blocks, the embeddings where the first stage is, the head where the last is):
        of the ranks with the same stages' shape, the one holding the most activations."""
        pipeline, pp = choice.pipeline, choice.mesh.pp
        assert pipeline is not None
        key = (pp, pipeline)
        if key not in self._pipelines:
            starts, last_stage = pipeline.first_blocks(), pipeline.num_stages - 1
            ranks: dict[tuple, PipelineRank] = {}
            for rank in range(pp):
                stages = pipeline.stages_of(rank, pp)
                blocks = tuple(
                    i for s in stages for i in range(starts[s], starts[s] + pipeline.stage_blocks[s])
                )
                first, last = 0 in stages, last_stage in stages
                shape = (tuple(id(self.setting.model.blocks[i]) for i in blocks), first, last)
                if shape not in self._stages:
                    model = pipeline_rank_share(self.setting.model, blocks, first=first, last=last)
                    self._stages[shape] = Estimator(replace(self.setting, model=model))
                m = choice.grad_accum_steps
                chunks = in_flight_chunks(pipeline, pp=pp, rank=rank, micro_batches=m)
                held = chunks / pipeline.stages_per_rank
                if shape not in ranks or held > ranks[shape].in_flight:
                    boundary = boundary_tensors(
                        pipeline, pp=pp, rank=rank, micro_batches=m, chunks_in_flight=chunks
                    )
                    ranks[shape] = PipelineRank(rank, self._stages[shape], held, boundary)
            self._pipelines[key] = tuple(ranks.values())
        return self._pipelines[key]

    def with_params(self, params: CostParameters) -> Estimator:
        """An estimator of the same model and precision under other cost parameters (another
        network, for a plan's interval: planner/plan_intervals.py), sharing the caches no parameter
        changes: the collective layouts (`comm_layout` reads the model, the precision and the
        choice) and their repeated groups."""
        other = Estimator(replace(self.setting, params=params))
        other._layouts, other._repeats, other._builders = self._layouts, self._repeats, self._builders
        return other

    def setting_for(self, choice: Choice) -> Setting:
        """The setting as one rank of the choice's tensor-, expert- and context-parallel groups sees
        it: its share of the model (its experts), and its share of every sequence (`seq_len` is the
        rank's own tokens)."""
        return self._share(choice.mesh.tp, choice.mesh.cp, choice.mesh.ep)

    def _share(self, tp: int, cp: int, ep: int = 1) -> Setting:
        key = (tp, cp, ep)
        if key not in self._shares:
            if cp == 1 and ep == 1:
                model = tensor_parallel_share(self.setting.model, tp)
            elif cp == 1:  # the ep share of the tp share
                model = expert_parallel_share(self._share(tp, 1).model, ep)
            else:  # the cp share of the tp (and ep) share (its units made once per tp degree)
                model = context_parallel_share(self._share(tp, 1, ep).model, cp)
            self._shares[key] = replace(self.setting, model=model, seq_len=self.setting.seq_len // cp)
        return self._shares[key]

    def layout(self, choice: Choice) -> CommLayout:
        """The choice's collective layout, over its tensor-parallel share's units for every cp
        degree: context parallelism changes no parameter, only what a block saves for backward,
        which memory reads from the setting's own model (`setting_for`), never from the layout's
        units (the search prices several cp degrees per tp degree: one layout serves them all)."""
        key = choice.layout_key
        if key not in self._layouts:
            base = (key[0], 1, *key[2:])  # (tp, cp, ..., ep): the layout of cp 1
            if base not in self._layouts:
                share = (key[0], key[-1])
                if share not in self._builders:
                    self._builders[share] = LayoutBuilder(self._share(key[0], 1, key[-1]))
                self._layouts[base] = self._builders[share].layout(choice)
            self._layouts[key] = self._layouts[base]
        return self._layouts[key]

    def moments(self, choice: Choice) -> tuple[MemoryEstimate, ...]:
        """Memory at the step's candidate peaks (planner/cost/memory.py); a pipeline's on the rank
        whose peak is the largest. Kept per choice: the search asks again for the choices it
        probed to see whether a family can fit at all."""
        moments = self._moments.get(choice)
        if moments is None:
            if choice.pipeline is not None:
                moments = max(self._ranks_moments(choice), key=_peak)
                del self._partial[choice]
            else:
                moments = self.rank_moments(choice)
            self._moments[choice] = moments
        return moments

    def states_gib(self, choice: Choice) -> float:
        """The parameters and optimizer states a rank keeps whatever else the choice does (the
        largest of a pipeline's ranks), in GiB: a bound under every moment's memory, without them."""
        ranks = [self] if choice.pipeline is None else [r.estimator for r in self.pipeline_ranks(choice)]
        states = (sharded_states(e.setting_for(choice), choice) for e in ranks)
        return max(params + optimizer for params, _, optimizer in states) / GIB

    def fits(self, choice: Choice, *, limit_gib: float, ceiling_gib: float | None) -> bool:
        """`fits_in_memory(self.memory(choice), ...)`, without pricing every rank of a pipeline
        that does not fit: its ranks are priced in turn (the first stage's, which holds the most
        in flight, first) until one peaks over the limit."""
        if choice.pipeline is None or choice in self._moments:
            return fits_in_memory(self.memory(choice), limit_gib=limit_gib, ceiling_gib=ceiling_gib)
        for moments in self._ranks_moments(choice):
            if not fits_in_memory(max(moments, key=_total), limit_gib=limit_gib, ceiling_gib=ceiling_gib):
                return False
        return True

    def _ranks_moments(self, choice: Choice) -> Iterator[tuple[MemoryEstimate, ...]]:
        """Each pipeline rank's moments (`pipeline_ranks`), priced once per choice as they are
        asked for (`fits` may stop after the first)."""
        done = self._partial.setdefault(choice, [])
        for i, r in enumerate(self.pipeline_ranks(choice)):
            if i == len(done):
                done.append(r.estimator.rank_moments(choice, in_flight=r.in_flight, boundary=r.boundary))
            yield done[i]

    def rank_moments(
        self, choice: Choice, *, in_flight: float = 1.0, boundary: BoundaryTensors | None = None
    ) -> tuple[MemoryEstimate, ...]:
        """The moments of this estimator's own model (a pipeline rank's: holding `in_flight`
        micro-batches' activations and its `boundary` tensors)."""
        setting = self.setting_for(choice)
        key = choice.activations_key
        if key not in self._saved:
            self._saved[key] = saved_activations(setting, choice)
        return memory_moments(
            setting, choice, self.layout(choice), self._saved[key], in_flight=in_flight, boundary=boundary
        )

    def memory(self, choice: Choice) -> MemoryEstimate:
        """The step's peak: the larger of its moments."""
        return max(self.moments(choice), key=_total)

    def repeats(self, choice: Choice) -> RepeatedLayout:
        """The layout's groups as repeated runs, checkpointing included (k-th-block checkpointing
        repeats with a longer period than the blocks themselves)."""
        layout = self.layout(choice)
        # Only k-th-block and first-n-blocks checkpointing treat blocks unalike (layouts live as
        # long as self).
        unalike = choice.checkpointing in ("selective", "blocks")
        key = (id(layout), (choice.checkpointing, choice.every_k) if unalike else 0)
        if key not in self._repeats:
            self._repeats[key] = repeated_layout(layout, choice)
        return self._repeats[key]

    def floor_s(self, choice: Choice, *, priced: bool = True) -> float:
        """A lower bound on the choice's step time without the timeline: what the search's floor
        test compares (planner/search.py). `priced`: with the collectives no timeline can hide
        (`rank_floor_s`); otherwise from the compute alone (`rank_compute_s`: shared by every sharding
        of the same tp, micro-batch, checkpointing and compile)."""
        if choice.pipeline is None:
            return self.rank_floor_s(choice) if priced else self.rank_compute_s(choice)
        # The slowest rank's own step, and the bubble its compute alone would leave (exposed
        # collectives only lengthen the chunks, and so the bubble).
        slowest = self._slowest_rank(choice).estimator
        floor = slowest.rank_floor_s(choice) if priced else slowest.rank_compute_s(choice)
        per_micro_batch = slowest._micro_batch_compute_s(choice)
        chunk = chunk_times(slowest.compute_split(choice), choice, per_micro_batch)
        pipeline, pp, m = choice.pipeline, choice.mesh.pp, choice.grad_accum_steps
        return floor + bubble_seconds(pipeline.schedule, pp=pp, chunk=chunk, micro_batches=m)

    def compute_split(self, choice: Choice) -> tuple[float, float, float]:
        """`compute_split` of this estimator's own model, cached by what compute depends on."""
        key = ("split", *choice.compute_key)
        if key not in self._compute_splits:
            self._compute_splits[key] = compute_split(self.setting_for(choice), choice)
        return self._compute_splits[key]

    def rank_floor_s(self, choice: Choice) -> float:
        """A lower bound on the step time `_timing` gives this estimator's own model (a pipeline
        rank's): each micro-batch's compute inside its collectives' `CommFloor`, and the optimizer
        and overhead around them."""
        last, middle = self._comm_floors(choice)
        compute_s = self._micro_batch_compute_s(choice)
        final = last.floor_s(compute_s)
        inner = middle.floor_s(compute_s) if _syncs_in_last_only(choice) else final
        optimizer_s, overhead_s = _outside_the_timeline(self.setting_for(choice), choice)
        return (choice.grad_accum_steps - 1) * inner + final + optimizer_s + overhead_s

    def rank_compute_s(self, choice: Choice) -> float:
        """The step's compute, optimizer and overhead on this estimator's own model (a pipeline
        rank's), as if every collective were hidden: which rank is the slowest."""
        optimizer_s, overhead_s = _outside_the_timeline(self.setting_for(choice), choice)
        return choice.grad_accum_steps * self._micro_batch_compute_s(choice) + optimizer_s + overhead_s

    def _micro_batch_compute_s(self, choice: Choice) -> float:
        key = choice.compute_key
        if key not in self._compute:
            self._compute[key] = _micro_batch_compute(self.setting_for(choice), choice)
        return self._compute[key]

    def compute_parts(self, choice: Choice) -> tuple[float, float]:
        """(recomputation, unfused eager kernels) seconds per step inside `TimeEstimate.compute_s`:
        the forward work re-run in backward, and what forward and backward take eager beyond the
        same kernels compiled (0 when compiled). What a loser's reason compares (planner/ranking.py)."""
        if choice.pipeline is not None:
            return self._slowest_rank(choice).estimator.rank_compute_parts(choice)
        return self.rank_compute_parts(choice)

    def rank_compute_parts(self, choice: Choice) -> tuple[float, float]:
        """`compute_parts` of this estimator's own model (a pipeline rank's)."""
        setting = self.setting_for(choice)
        p, m = setting.params, setting.model
        tokens = choice.micro_batch_size * setting.seq_len

        def forward_backward(f: ForwardTime) -> float:
            return f.total * (1.0 + BACKWARD_FLOPS_RATIO) + ATTENTION_BACKWARD_EXTRA * f.attention

        def unit_times(u: UnitCost) -> tuple[ForwardTime, float]:
            """The unit's forward, and what eager adds to its forward and backward."""
            whole = choice.float8_casts_whole_sequence
            f = _forward_time(
                p, setting.act_bytes, u, tokens, choice.compile, choice.float8, seq_len=m.seq_len,
                whole_sequence_casts=whole,
            )
            if choice.compile:
                return f, 0.0
            return f, forward_backward(f) - forward_backward(
                _forward_time(
                    p, setting.act_bytes, u, tokens, True, choice.float8, seq_len=m.seq_len,
                    whole_sequence_casts=whole,
                )
            )

        # The model's repeated blocks are one object (planner/cost/model_costs.py): priced once each.
        times: dict[int, tuple[ForwardTime, float]] = {}
        recompute = eager = 0.0
        for index, u in [(-1, m.embedding), *enumerate(m.blocks), (-1, m.head)]:
            if id(u) not in times:
                times[id(u)] = unit_times(u)
            f, eager_extra = times[id(u)]
            recompute += _recompute_time(choice, u, index, f)
            if not choice.compile:
                eager += eager_extra
        return recompute * choice.grad_accum_steps, eager * choice.grad_accum_steps

    def price(self, choice: Choice) -> PricedStep:
        """The choice's groups priced, ready for the timeline."""
        setting, key = self.setting_for(choice), choice.compute_key
        if key not in self._unit_times:
            self._unit_times[key] = _UnitTimes(setting, choice)
        return _price(setting, choice, self.collectives(choice), self.repeats(choice), self._unit_times[key])

    def collectives(self, choice: Choice) -> Collectives:
        """The choice's FSDP collectives group by group (`_collectives`), shared by the choices of
        one layout, checkpointing period and mesh."""
        repeats = self.repeats(choice)
        key = (id(repeats), choice.sharding, choice.mesh, choice.simple_fsdp, choice.fsdp2_pipeline)
        if key not in self._collectives:
            setting, layout = self.setting_for(choice), self.layout(choice)
            self._collectives[key] = _collectives(setting, choice, layout, repeats)
        return self._collectives[key]

    def _comm_floors(self, choice: Choice) -> tuple[CommFloor, CommFloor]:
        """The `CommFloor`s of the last micro-batch and the earlier ones: of the layout and mesh
        alone (how the groups repeat with the checkpointing changes no total)."""
        key = (choice.layout_key, choice.sharding, choice.mesh, choice.simple_fsdp, choice.fsdp2_pipeline)
        if key not in self._floors:
            collectives = self.collectives(choice)
            last = CommFloor.of(collectives.last)
            same = collectives.middle is collectives.last
            self._floors[key] = (last, last if same else CommFloor.of(collectives.middle))
        return self._floors[key]

    def layout_signature(self, choice: Choice) -> int | tuple[int, ...]:
        """What the choice's collective layouts look like (every pipeline rank's), as small numbers
        standing for `CommLayout.signature`s: choices equal in this and in their `priced_key` price
        the same. (The search looks these up once per candidate: a number hashes at once, a
        signature's nested tuples element by element.)"""
        if choice.pipeline is not None:
            return tuple(r.estimator._signature_number(choice) for r in self.pipeline_ranks(choice))
        return self._signature_number(choice)

    def _signature_number(self, choice: Choice) -> int:
        key = choice.layout_key
        number = self._signature_numbers.get(key)
        if number is None:
            signature = self.layout(choice).signature
            number = self._signatures.setdefault(signature, len(self._signatures))
            self._signature_numbers[key] = number
        return number

    def _slowest_rank(self, choice: Choice) -> PipelineRank:
        return max(self.pipeline_ranks(choice), key=lambda r: r.estimator.rank_compute_s(choice))

    def timing(
        self, choice: Choice, *, record: bool = False, priced: PricedStep | None = None
    ) -> TimeEstimate:
        """The step's time on the two-stream timeline (`priced`: this choice's `price`, if known).

        A pipeline's step is its slowest rank's: that rank's micro-batches, each through its
        stages, priced as a model of their own; the schedule's bubble; and the sends on the
        critical path."""
        if choice.pipeline is not None:
            return self._pipeline_timing(choice, record=record)
        priced = priced or self.price(choice)
        return _timing(priced, choice, self.setting.params.overlap_contention, record=record)

    def _pipeline_timing(self, choice: Choice, *, record: bool) -> TimeEstimate:
        assert choice.pipeline is not None
        contention = self.setting.params.overlap_contention
        busiest: tuple[TimeEstimate, Estimator] | None = None
        for r in self.pipeline_ranks(choice):
            time = _timing(r.estimator.price(choice), choice, contention, record=record)
            if busiest is None or time.step_time_s > busiest[0].step_time_s:
                busiest = (time, r.estimator)
        assert busiest is not None
        time, estimator = busiest
        busy = (time.step_time_s - time.optimizer_s - time.overhead_s) / choice.grad_accum_steps
        chunk = chunk_times(estimator.compute_split(choice), choice, busy)
        pipeline, pp, m = choice.pipeline, choice.mesh.pp, choice.grad_accum_steps
        bubble = bubble_seconds(pipeline.schedule, pp=pp, chunk=chunk, micro_batches=m)
        # The hidden states sent are the whole model's width (a rank without the head has none).
        p2p = pipeline_exposed_p2p(chunk, point_to_point_seconds(self.setting_for(choice), choice), choice)
        return replace(
            time,
            step_time_s=time.step_time_s + bubble + p2p,
            comm_s=time.comm_s + p2p,
            pipeline_bubble_s=bubble,
            pipeline_p2p_s=p2p,
        )


@dataclass(frozen=True, slots=True)
class PipelineRank:
    """A pipeline rank the cost model prices: its stages as a model of their own."""

    rank: int
    estimator: Estimator
    """Prices the rank's stages (their blocks, with the embeddings or the head where they are)."""
    in_flight: float
    """Micro-batches' activations the rank holds at its peak (chunks in flight / its stages)."""
    boundary: BoundaryTensors
    """The hidden states it holds for its stages' sends and receives."""
