"""Predict step time, throughput and peak memory of one parallel configuration.

`Choice` is the search's light-weight configuration (the Plan's `ParallelConfig` is built only for
the plans that are reported). `Estimator.memory()` is cheap and runs first so that search can prune by
memory before paying for the timeline in `Estimator.timing()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.model_costs import ModelCosts, UnitCost
from planner.cost.parameters import GIB, CostParameters, LinkClass
from planner.cost.timeline import GroupTimes, TimelineResult, simulate
from planner.specs import Optimizer, Precision

MB = 1e6


@dataclass(frozen=True, slots=True)
class Choice:
    """One point of the search space."""

    sharding: str
    shard_group: int
    replicate_group: int
    blocks_per_unit: int
    all_gather_bucket_mb: float
    reduce_scatter_bucket_mb: float
    checkpointing: str
    every_k: int
    micro_batch: int
    grad_accum: int
    compile: bool
    prefetch_depth: int = 1

    @property
    def family(self) -> str:
        shard = self.sharding
        if self.sharding == "hybrid_shard":
            shard += f"/{self.shard_group}x{self.replicate_group}"
        return f"{shard} {'compiled' if self.compile else 'eager'}"

    @property
    def reshards_after_forward(self) -> bool:
        return self.sharding in ("full_shard", "hybrid_shard")


@dataclass(frozen=True, slots=True)
class Setting:
    """What stays fixed across the search: model, hardware, precision, batch."""

    model: ModelCosts
    params: CostParameters
    precision: Precision
    optimizer: Optimizer
    world_size: int
    gpus_per_node: int
    num_nodes: int
    seq_len: int
    global_batch_sequences: int

    @property
    def param_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    @property
    def act_bytes(self) -> int:
        return self.param_bytes


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per GPU at peak, by purpose."""

    params: float
    grads: float
    optimizer: float
    activations: float
    unsharded: float
    logits: float
    workspace: float
    fragmentation: float

    @property
    def total(self) -> float:
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.activations
            + self.unsharded
            + self.logits
            + self.workspace
            + self.fragmentation
        )

    @property
    def sharded_states(self) -> float:
        return self.params + self.grads + self.optimizer


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


# ---------------------------------------------------------------- grouping


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
    group_params: tuple[int, ...]
    """Parameters per all-gather group."""
    largest_reduce: int
    """Parameters of the largest gradient-reduction bucket."""
    signature: tuple
    """Equal for layouts that price identically (the search memoizes on it)."""


def _wrap_units(setting: Setting, choice: Choice) -> list[list[IndexedUnit]]:
    m = setting.model
    blocks = list(enumerate(m.blocks))
    k = choice.blocks_per_unit
    units: list[list[IndexedUnit]] = [[(-1, m.embedding)]]
    units += [blocks[i : i + k] for i in range(0, len(blocks), k)]
    units.append([(-1, m.head)])
    return units


def _bucket(units: list[list[IndexedUnit]], cap_bytes: float, bytes_per_param: int) -> list[list[int]]:
    """Indices of consecutive units merged while their total stays under the cap."""
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0.0
    for index, unit in enumerate(units):
        unit_bytes = sum(u.num_params for _, u in unit) * bytes_per_param
        if current and (cap_bytes <= 0 or current_bytes + unit_bytes > cap_bytes):
            buckets.append(current)
            current, current_bytes = [], 0.0
        current.append(index)
        current_bytes += unit_bytes
    buckets.append(current)
    return buckets


def comm_layout(setting: Setting, choice: Choice) -> CommLayout:
    """Eager FSDP2 issues one all-gather and one reduce-scatter per wrap unit; compiled
    SimpleFSDP lets inductor merge consecutive ones up to the bucket caps."""
    units = _wrap_units(setting, choice)
    ag_cap = choice.all_gather_bucket_mb * MB if choice.compile else 0.0
    rs_cap = choice.reduce_scatter_bucket_mb * MB if choice.compile else 0.0
    ag_buckets = _bucket(units, ag_cap, setting.param_bytes)
    group_of_unit = {u: g for g, bucket in enumerate(ag_buckets) for u in bucket}
    reversed_units = units[::-1]
    reduce: list[list[int]] = [[] for _ in ag_buckets]
    for bucket in _bucket(reversed_units, rs_cap, 4):
        last_unit = len(units) - 1 - bucket[-1]  # in backward order the bucket completes here
        params = sum(u.num_params for i in bucket for _, u in reversed_units[i])
        reduce[group_of_unit[last_unit]].append(params)
    groups = tuple(tuple(x for i in bucket for x in units[i]) for bucket in ag_buckets)
    reduce_buckets = tuple(tuple(r) for r in reduce)
    return CommLayout(
        groups=groups,
        reduce_buckets=reduce_buckets,
        group_params=tuple(sum(u.num_params for _, u in g) for g in groups),
        largest_reduce=max(p for bucket in reduce_buckets for p in bucket),
        signature=(tuple(len(g) for g in groups), reduce_buckets),
    )


def _is_checkpointed(choice: Choice, block_index: int) -> bool:
    if choice.checkpointing == "full":
        return True
    if choice.checkpointing == "selective":
        return (block_index + 1) % choice.every_k == 0
    return False


# ---------------------------------------------------------------- memory


def _memory(setting: Setting, choice: Choice, layout: CommLayout, saved_elems: float) -> MemoryEstimate:
    """Peak bytes per GPU, by what is alive at the peak.

    Two moments compete. The start of the last micro-batch's backward holds every saved activation,
    the logits and their gradient, and the gathered parameters; gradients exist then only from
    earlier micro-batches (this micro-batch's are allocated as backward frees its activations).
    The optimizer step holds the states and all gradients, nothing transient. The larger is the peak.
    """
    m = setting.model
    p = setting.params
    n_params = m.num_params
    shard = choice.shard_group
    opt_bytes = 8 if setting.optimizer == "adamw" else 4
    master = 4.0 * n_params / shard
    grads = 4.0 * n_params / shard
    optimizer = opt_bytes * n_params / shard

    group_params = layout.group_params
    largest_reduce = layout.largest_reduce
    pb = setting.param_bytes
    # Gradients come out of backward in the compute dtype and are cast to fp32 for reduction.
    grad_buffer = (pb + 4) if pb == 2 else 4
    depth = choice.prefetch_depth
    if choice.sharding in ("full_shard", "hybrid_shard"):
        unsharded = (
            max(pb * sum(group_params[max(0, j - depth) : j + 1]) for j in range(len(group_params)))
            + grad_buffer * largest_reduce
        )
    elif choice.sharding == "shard_grad_op" or not choice.compile:
        # ZeRO-2 keeps every gathered parameter until backward. So does eager no_shard: FSDP2 on a
        # shard group of one still copies each parameter into an unsharded buffer, kept through
        # backward as no_shard does not reshard.
        unsharded = pb * n_params + grad_buffer * largest_reduce
    else:  # compiled no_shard: fp32 weights are used in place; compute-dtype copies are transient
        unsharded = (pb * (depth + 2) * max(group_params)) if pb == 2 else 0.0

    tokens = choice.micro_batch * setting.seq_len
    activations = saved_elems * tokens * setting.act_bytes
    # Eager: fp32 upcast of logits, log-softmax output and its gradient alive together.
    # Compiled: the loss is fused; logits in the compute dtype plus one fp32 gradient buffer.
    logits_bytes = 12.0 if not choice.compile else setting.act_bytes + 4.0
    logits = tokens * m.vocab_size * logits_bytes
    dynamic = activations + unsharded + logits
    workspace = p.workspace_gib * GIB
    in_backward = MemoryEstimate(
        params=master,
        grads=grads if choice.grad_accum > 1 else 0.0,
        optimizer=optimizer,
        activations=activations,
        unsharded=unsharded,
        logits=logits,
        workspace=workspace,
        fragmentation=p.fragmentation * dynamic,
    )
    in_update = MemoryEstimate(
        params=master,
        grads=grads,
        optimizer=optimizer,
        activations=0.0,
        unsharded=0.0,
        logits=0.0,
        workspace=workspace,
        fragmentation=0.0,
    )
    return max(in_backward, in_update, key=lambda estimate: estimate.total)


def saved_elems_per_token(setting: Setting, checkpointing: str, every_k: int, compile_: bool) -> float:
    """Activation elements alive per token at the start of backward, including the transient
    recompute of one checkpointed block."""
    m = setting.model
    probe = Choice("", 1, 1, 1, 0.0, 0.0, checkpointing, every_k, 1, 1, compile_)
    saved = m.head.saved_elems
    recompute_peak = 0.0
    for i, block in enumerate(m.blocks):
        if _is_checkpointed(probe, i):
            kept = block.input_elems + _compiled_keeps(probe, block)
            saved += kept
            recompute_peak = max(recompute_peak, block.saved_elems - kept + block.input_elems)
        elif checkpointing == "op_selective":
            saved += block.op_saved_elems
            recompute_peak = max(recompute_peak, block.saved_elems - block.op_saved_elems)
        else:
            saved += block.saved_elems
    return saved + recompute_peak


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


def _compiled_keeps(choice: Choice, unit: UnitCost) -> float:
    """Elements per token a compiled whole-block checkpoint keeps besides the block input.

    The runtime's compiled whole-block checkpointing keeps attention outputs (torch 2.13 cannot
    recompute attention over DTensor parameters under torch.compile; see
    executor/runtime/activation_checkpoint.py), so it saves more and recomputes less than eager.
    """
    return unit.attention_output_elems if choice.compile else 0.0


def _recompute_time(choice: Choice, unit: UnitCost, index: int, fwd: ForwardTime) -> float:
    """Forward work re-run in backward for a checkpointed (or op-selective) block."""
    if index < 0:
        return 0.0
    if _is_checkpointed(choice, index):
        return fwd.total - (fwd.attention if _compiled_keeps(choice, unit) else 0.0)
    if choice.checkpointing == "op_selective" and unit.matmul_params:
        # The unsaved matmuls and every elementwise op run again; attention output is saved.
        share = unit.op_recompute_matmul_params / unit.matmul_params
        return fwd.matmul * share + fwd.elementwise
    return 0.0


def _collective(
    p: CostParameters, link: LinkClass, nbytes: float, group: int, *, all_reduce: bool = False
) -> float:
    if group <= 1 or nbytes <= 0:
        return 0.0
    lp = p.links[link]
    volume = nbytes * (group - 1) / group * (2.0 if all_reduce else 1.0)
    return lp.latency(group) * (2.0 if all_reduce else 1.0) + volume / lp.bandwidth


def _timing(setting: Setting, choice: Choice, layout: CommLayout, *, record: bool) -> TimeEstimate:
    """Step time from the two-stream timeline of one micro-batch, times accumulation."""
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

    last: list[GroupTimes] = []
    middle: list[GroupTimes] = []
    for group, reduce_buckets in zip(layout.groups, layout.reduce_buckets, strict=True):
        fwd = 0.0
        bwd = 0.0
        for index, u in group:
            f = unit_forward(u)
            fwd += f.total
            bwd += 2.0 * f.total + _recompute_time(choice, u, index, f)
        n_params = sum(u.num_params for _, u in group)
        ag = 0.0
        reduce = 0.0
        if choice.sharding != "no_shard":
            ag = _collective(p, shard_link, pb * n_params, shard)
            for params in reduce_buckets:
                reduce += _collective(p, shard_link, 4.0 * params, shard)
                if choice.sharding == "hybrid_shard":
                    reduce += _collective(p, replica_link, 4.0 * params / shard, replicas, all_reduce=True)
            sync_every_micro_batch = reduce
        else:
            for params in reduce_buckets:
                reduce += _collective(p, world_link, 4.0 * params, setting.world_size, all_reduce=True)
            # Eager (FSDP2) replicas accumulate locally and all-reduce once per step; compiled
            # SimpleFSDP's all-reduce is part of every backward graph.
            sync_every_micro_batch = reduce if choice.compile else 0.0
        ag_bwd = ag if choice.reshards_after_forward else 0.0
        last.append(GroupTimes(fwd, bwd, ag, ag_bwd, reduce))
        middle.append(GroupTimes(fwd, bwd, ag, ag_bwd, sync_every_micro_batch))

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
    overhead_s = (p.micro_batch_overhead_s + (p.sharding_overhead_s if sharded else 0.0)) * choice.grad_accum

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
    """Prices many choices for one setting, caching what choices share (layouts, activations)."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self._layouts: dict[tuple, CommLayout] = {}
        self._saved: dict[tuple[str, int, bool], float] = {}

    def layout(self, choice: Choice) -> CommLayout:
        key = (
            choice.blocks_per_unit,
            choice.compile,
            choice.all_gather_bucket_mb if choice.compile else 0.0,
            choice.reduce_scatter_bucket_mb if choice.compile else 0.0,
        )
        if key not in self._layouts:
            self._layouts[key] = comm_layout(self.setting, choice)
        return self._layouts[key]

    def memory(self, choice: Choice) -> MemoryEstimate:
        key = (choice.checkpointing, choice.every_k, choice.compile)
        if key not in self._saved:
            self._saved[key] = saved_elems_per_token(self.setting, *key)
        return _memory(self.setting, choice, self.layout(choice), self._saved[key])

    def timing(self, choice: Choice, *, record: bool = False) -> TimeEstimate:
        return _timing(self.setting, choice, self.layout(choice), record=record)
