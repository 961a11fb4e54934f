"""Peak memory per GPU: what the runtime holds, moment by moment through one training step.

The moments of the last micro-batch compete, and the largest is the step's peak:

- *loss*, at the end of forward: master parameters, optimizer states (they exist from the first
  optimizer step on, so every later step carries them through forward), gradients of the earlier
  micro-batches, every saved activation, the gathered parameters in flight, and the loss itself:
  one slice of logits (the runtime runs the output projection and cross-entropy over
  `loss_chunks` slices, each computing its gradients at once) and the head's gradient accumulator;
- *backward start*: the same, with the head's gradient (from the loss) and its reduction buffer
  in place of the loss's working memory;
- *backward recompute*, with checkpointing: this micro-batch's gradients are arriving (priced
  whole), and one checkpointed block is recomputed beside the saved activations;
- *optimizer step*: parameters, all gradients, optimizer states (created here in the first step)
  and the update's temporaries.

Each moment's allocations are priced in bytes per term (`MEMORY_TERMS`); the allocator then keeps
part of the transient memory reserved but unusable (fragmentation, smaller with
`expandable_segments`), priced as a fraction of it. The total is what `max_memory_reserved` reports.
The CUDA context and NCCL's buffers lie outside the allocator: they shrink the usable capacity
(`CostParameters.usable_memory_gib`) instead of adding to the peak.

Search, the plan's breakdown and the dashboard all read this one estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

from contract.loss_slices import LOSS_SLICE_BYTES_PER_ELEMENT
from contract.mesh import MODEL_PARALLEL_AXES, Mesh, axis
from planner.cost.layout import CommLayout
from planner.cost.model_costs import UnitCost, eager_saved_bytes
from planner.cost.parameters import GIB, CostParameters
from planner.cost.pipeline import BoundaryTensors
from planner.cost.setting import SINGLE_RANK, Choice, Setting


class MemoryTerm(NamedTuple):
    label: str
    """The words a person reads (CLI, dashboard)."""
    meaning: str
    """What the term holds (docs, the Plan's JSON schema)."""


MEMORY_TERMS: dict[str, MemoryTerm] = {
    "params": MemoryTerm(
        "parameters",
        "Master parameters (fp32; bf16 in pure bf16 training): the rank's tensor-parallel share, sharded "
        "over the shard group.",
    ),
    "grads": MemoryTerm(
        "gradients",
        "Sharded gradients alive at the moment: from earlier micro-batches until backward, this "
        "micro-batch's too while it recomputes, all of them at the optimizer step.",
    ),
    "optimizer": MemoryTerm(
        "optimizer states", "Optimizer states, plus the update's temporaries at the optimizer step."
    ),
    "activations": MemoryTerm(
        "activations",
        "Tensors saved for backward (and one checkpointed block's recompute, at that moment).",
    ),
    "unsharded_params": MemoryTerm(
        "gathered parameters",
        "All-gathered compute-dtype parameters in flight (or kept, without resharding), and eager "
        "FSDP2's last all-gather buffer.",
    ),
    "grad_buffers": MemoryTerm(
        "gradient buffers", "Unsharded gradients of the unit being reduced and their reduce-dtype buffer."
    ),
    "logits": MemoryTerm(
        "logits & loss",
        "The loss's working memory: one slice's logits, the head's gradient accumulator, and the "
        "hidden-state gradient it keeps for backward.",
    ),
    "workspace": MemoryTerm(
        "workspace",
        "Library workspace inside the allocator (cuBLAS); the CUDA context and NCCL are outside it "
        "and reduce the usable memory instead.",
    ),
    "allocator_reserve": MemoryTerm(
        "allocator reserve", "Reserved by the caching allocator but not allocatable (fragmentation)."
    ),
}
"""Every term of the estimate, in stacking order: the one description the estimate, the Plan's
breakdown, the CLI and the dashboard share."""

PRICED_ALLOCATOR_CONFIG = "expandable_segments:True"
"""The caching allocator's configuration (`PYTORCH_CUDA_ALLOC_CONF`) whose reserve the estimate prices:
the launchers set it (executor/launch/environment.py) and the profiler runs under it, because the
reserve beyond allocated bytes is the allocator's, not the model's: without expandable segments a step
that frees and re-allocates gigabyte-sized loss slices and activations can hold half as much again."""


def runs_priced_allocator(allocator_config: str | None) -> bool:
    """Whether memory measured under `allocator_config` (a `PYTORCH_CUDA_ALLOC_CONF` value; None: not
    recorded) shows the reserve of the allocator the estimate prices (`PRICED_ALLOCATOR_CONFIG`)."""
    if allocator_config is None:
        return False
    options = dict(option.partition(":")[::2] for option in allocator_config.replace(" ", "").split(","))
    key, _, value = PRICED_ALLOCATOR_CONFIG.partition(":")
    return options.get(key, "").lower() == value.lower()


@dataclass(slots=True)
class MemoryEstimate:
    """Bytes per GPU at one moment of a step, by purpose (the terms of MEMORY_TERMS). Not frozen:
    the search builds four per configuration it prices, and a frozen dataclass sets each field
    through `object.__setattr__` (4x slower to build); nothing changes one once built."""

    params: float
    grads: float
    optimizer: float
    activations: float
    unsharded_params: float
    grad_buffers: float
    logits: float
    workspace: float
    allocator_reserve: float
    moment: str = "backward start"
    """When the peak happens: `loss`, `backward start`, `backward recompute` or `optimizer step`."""

    @property
    def total(self) -> float:
        # Spelled out: the search sums thousands of these (the assert below keeps it complete).
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.activations
            + self.unsharded_params
            + self.grad_buffers
            + self.logits
            + self.workspace
            + self.allocator_reserve
        )

    @property
    def sharded_states(self) -> float:
        return self.params + self.grads + self.optimizer

    def terms(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in MEMORY_TERMS}


assert tuple(f.name for f in fields(MemoryEstimate))[:-1] == tuple(MEMORY_TERMS)


AUTOGRAD_LOSS_BYTES_PER_ELEMENT = 4.0 + 4.0
"""`cross_entropy(logits.float(), targets)` over the whole micro-batch, per (token x vocabulary
entry), besides the compute-dtype logits themselves (kept by the trainer until backward): the fp32
copy and log-softmax's fp32 output, which it saves for backward."""
AUTOGRAD_LOSS_BACKWARD_BYTES_PER_ELEMENT = 12.0
"""The same loss's backward: the saved fp32 log-softmax output, the dense fp32 gradient that
nll_loss's backward hands it, and the fp32 gradient it computes from both (the trainer has freed the
logits before backward, as torchtitan does)."""
LOSS_PARALLEL_EXTRA_BYTES_PER_ELEMENT = 4.0
"""Over the vocabulary shards of tensor parallelism, torch's loss parallelism
(`torch.distributed.tensor.parallel.loss_parallel`) computes the same loss from unfused fp32 ops:
its log-softmax keeps the shifted logits beside their exponentials (forward), its backward the
exponentials beside the sum it forms from them; one more fp32 tensor of the shard's size at each
peak (measured at 14 and 16 bytes an element with torch's memory tracker, bf16 logits included)."""


def loss_bytes(setting: Setting, choice: Choice) -> float:
    """What the loss holds while it runs, at the end of forward: one slice of vocabulary-sized
    tensors, the fp32 accumulator of the head's weight gradient (with, in bf16, one slice's
    contribution before it is added), and the hidden-state gradient, already whole. An autograd loss
    holds the whole micro-batch's logits, their fp32 copy and the log-softmax instead."""
    m = setting.model
    tokens = choice.micro_batch_size * setting.seq_len
    if choice.loss == "compiled_fp32":
        return tokens * m.vocab_size * setting.act_bytes  # the logits; the fused loss holds no copy
    if choice.loss in ("autograd_fp32", "chunked_fp32"):
        copy = AUTOGRAD_LOSS_BYTES_PER_ELEMENT - (4.0 if setting.act_bytes == 4 else 0.0)  # fp32: no copy
        copy += _loss_parallel_extra(setting)
        chunks = choice.loss_chunks if choice.loss == "chunked_fp32" else 1
        return tokens * m.vocab_size * (setting.act_bytes + copy / chunks)
    slice_tokens = math.ceil(tokens / choice.loss_chunks)
    per_element = LOSS_SLICE_BYTES_PER_ELEMENT[setting.act_bytes]
    head_weight = m.head.matmul_params if m.vocab_size else 0
    weight_grad = (4 + (setting.act_bytes if setting.act_bytes < 4 else 0)) * head_weight
    return slice_tokens * m.vocab_size * per_element + weight_grad + _hidden_grad_bytes(setting, choice)


def _backward_start_loss_bytes(setting: Setting, choice: Choice) -> float:
    """What the loss holds as backward starts: the sliced loss's hidden-state gradient, or the
    autograd loss's backward through log-softmax."""
    tokens = choice.micro_batch_size * setting.seq_len
    backward = AUTOGRAD_LOSS_BACKWARD_BYTES_PER_ELEMENT + _loss_parallel_extra(setting)
    if choice.loss == "autograd_fp32":
        return tokens * setting.model.vocab_size * backward
    if choice.loss == "compiled_fp32":
        # The fused backward writes the logits' compute-dtype gradient, nothing in fp32.
        return tokens * setting.model.vocab_size * setting.act_bytes
    if choice.loss == "chunked_fp32":
        # One chunk's backward, beside the compute-dtype gradient of the logits it is filling in.
        per_element = setting.act_bytes + backward / choice.loss_chunks
        return tokens * setting.model.vocab_size * per_element
    return _hidden_grad_bytes(setting, choice)


def _loss_parallel_extra(setting: Setting) -> float:
    """Bytes per (token x vocabulary entry) torch's loss parallelism adds to an autograd loss."""
    return LOSS_PARALLEL_EXTRA_BYTES_PER_ELEMENT if setting.model.tensor_parallel > 1 else 0.0


def _hidden_grad_bytes(setting: Setting, choice: Choice) -> float:
    """The loss's gradient w.r.t. the final hidden states, kept from the loss to backward."""
    tokens = choice.micro_batch_size * setting.seq_len
    return setting.model.head.input_elems * tokens * setting.act_bytes if setting.model.vocab_size else 0.0


@dataclass(frozen=True, slots=True)
class SavedActivations:
    """Activation elements per token of one checkpointing policy."""

    saved: float
    """Saved for backward at its start."""
    recompute: float
    """Added while the largest checkpointed block is recomputed (0 without checkpointing)."""


def saved_activations(setting: Setting, choice: Choice) -> SavedActivations:
    """What the choice's checkpointing keeps per token, and what its recompute adds
    (`Choice.activations_key` is what it depends on)."""
    m = setting.model
    act_bytes = setting.act_bytes
    # The model's repeated blocks are one object (planner/cost/model_costs.py): each is worked out once.
    per_block: dict[int, tuple[float, float, float]] = {}

    def whole(unit: UnitCost) -> float:
        # Everything the unit's forward keeps, in compute-dtype elements (eager keeps some in fp32).
        if choice.compile and not choice.simple_fsdp and unit.compiled_saved_elems is not None:
            # Blocks compiled as plain modules (another trainer's): what inductor's partitioner keeps.
            return unit.compiled_saved_elems
        if choice.compile:
            return unit.saved_elems
        return eager_saved_bytes(unit, act_bytes) / act_bytes

    def kept(block: UnitCost) -> tuple[float, float, float]:
        """(everything, kept when checkpointed whole, kept under op-level checkpointing)."""
        kept_op = block.op_saved_elems
        if choice.checkpoint_saves_gathers:
            kept_op += tensor_parallel_gathered(block)
        return whole(block), block.input_elems + compiled_keeps(choice, block), kept_op

    saved = whole(m.head)
    recompute_peak = 0.0
    op_selective = choice.checkpointing == "op_selective"
    for i, block in enumerate(m.blocks):
        terms = per_block.get(id(block))
        if terms is None:
            terms = per_block[id(block)] = kept(block)
        everything, kept_whole, kept_op = terms
        if choice.is_checkpointed(i):
            saved += kept_whole
            recompute_peak = max(recompute_peak, everything - kept_whole + block.input_elems)
        elif op_selective:
            saved += kept_op
            recompute_peak = max(recompute_peak, everything - kept_op)
        else:
            saved += everything
    return SavedActivations(saved, recompute_peak)


def tensor_parallel_gathered(unit: UnitCost) -> float:
    """Elements per token a tensor-parallel share of `unit` all-gathers whole (0 without tp)."""
    return unit.gathered_elems if unit.linear_share > 1 else 0.0


def tensor_parallel_scattered(unit: UnitCost) -> float:
    """Elements per token a tensor-parallel share of `unit` keeps of what it reduce-scattered."""
    if unit.linear_share == 1:
        return 0.0
    return (unit.tp_collective_elems - unit.gathered_elems) / unit.linear_share


def compiled_keeps(choice: Choice, unit: UnitCost) -> float:
    """Elements per token a compiled whole-block checkpoint keeps besides the block input.

    This project's compiled whole-block checkpointing keeps attention outputs (torch 2.13 cannot
    recompute attention over DTensor parameters under torch.compile; see
    executor/runtime/activation_checkpoint.py) and, being a policy that keeps what collectives
    produced, the sequence shards tensor parallelism reduce-scattered (and its gathered inputs when
    parameters stay gathered, `Choice.checkpoint_saves_gathers`); so it saves more and recomputes
    less than eager. Blocks compiled one by one over plain parameters (torchtitan) recompute all of
    it.
    """
    if not choice.simple_fsdp:
        return 0.0
    gathered = tensor_parallel_gathered(unit) if choice.checkpoint_saves_gathers else 0.0
    return unit.attention_output_elems + tensor_parallel_scattered(unit) + gathered


def _unsharded_params(setting: Setting, choice: Choice, layout: CommLayout, *, blocks_only: bool) -> float:
    """Bytes of gathered parameters alive while the layout's groups (its block groups only) compute."""
    pb = setting.param_bytes
    depth = choice.prefetch_depth
    if choice.sharding == "no_shard" and choice.engine != "fsdp-planner" and pb >= setting.state_bytes:
        # Another trainer that does not shard (torchtune's single-device recipe, torchtitan on one
        # GPU: no FSDP wrapping) uses its weights in place when they are in the compute dtype already
        # (pure bf16): nothing is gathered or cast. This project's eager no_shard is FSDP2 (below).
        return 0.0
    if choice.sharding in ("full_shard", "hybrid_shard"):
        # The group computing and the ones prefetched ahead of it.
        gathered = layout.largest_gather(depth + 1, blocks_only=blocks_only)
    elif choice.sharding == "shard_grad_op" or not choice.simple_fsdp:
        # ZeRO-2 keeps every gathered parameter until backward. So does eager no_shard: FSDP2 on a
        # shard group of one still copies each parameter into an unsharded buffer, kept through
        # backward as no_shard does not reshard.
        gathered = layout.model_gather_bytes
    else:
        # Compiled no_shard uses fp32 weights in place; compute-dtype copies are transient (none
        # when the weights are in the compute dtype already: pure bf16).
        copies = pb < setting.state_bytes
        return (depth + 2) * layout.largest_gather(1, blocks_only=blocks_only) if copies else 0.0
    if not choice.simple_fsdp:
        # FSDP2 keeps the last all-gather's output buffer until the next all-gather is issued (so
        # that the allocator cannot hand it to another stream early): one unit's worth, besides
        # the parameters copied out of it (measured with FSDPMemTracker, tests/executor).
        gathered += layout.largest_gather(1, blocks_only=blocks_only)
    return gathered


def sharded_states(setting: Setting, choice: Choice) -> tuple[float, float, float]:
    """Bytes of one rank's parameters, gradients and optimizer states (fp32, or bf16 in pure bf16
    training: `Setting.state_dtype`): its tensor-parallel share (its pipeline stages') sharded over
    dp_shard x cp. No checkpointing, micro-batch or bucket cap changes them."""
    n_params = setting.model.rank_params
    shard = choice.mesh.fsdp_shards
    element = float(setting.state_bytes)
    states = (2 if setting.optimizer == "adamw" else 1) * element
    if choice.mesh.ep > 1:
        # The rank's num_experts / ep routed experts are sharded over the (dp_shard x cp) / ep ranks
        # left after ep (torchtitan's dp_shard_mod_ep), the dense parts over dp_shard x cp.
        n_params = n_params * 1.0 + _local_expert_params(setting) * (shard / choice.mesh.expert_shards - 1)
    return element * n_params / shard, element * n_params / shard, states * n_params / shard


def _local_expert_params(setting: Setting) -> int:
    """The routed experts' parameters the rank holds (its expert-parallel share's blocks)."""
    return sum(b.expert_params for b in setting.model.blocks)


@dataclass(slots=True)
class _Held:
    """What one rank holds at every moment of the step (its sharded states, the workspace), and
    the share of the transient memory that the allocator keeps reserved. Not frozen, like
    `MemoryEstimate`: the search builds one per configuration it prices."""

    params: float
    grads: float
    optimizer: float
    workspace: float
    allocator_reserve: float

    def at(
        self,
        moment: str,
        *,
        grads_alive: float,
        activations_alive: float,
        gathered: float,
        grad_buffers: float,
        logits: float,
    ) -> MemoryEstimate:
        """A moment in forward or backward: the states, and what is alive beside them."""
        transient = grads_alive + activations_alive + gathered + grad_buffers + logits
        return MemoryEstimate(
            params=self.params,
            grads=grads_alive,
            optimizer=self.optimizer,
            activations=activations_alive,
            unsharded_params=gathered,
            grad_buffers=grad_buffers,
            logits=logits,
            workspace=self.workspace,
            allocator_reserve=self.allocator_reserve * transient,
            moment=moment,
        )

    def optimizer_step(self, *, temporaries: float, received: float) -> MemoryEstimate:
        """The update: every gradient and the optimizer's temporaries; of the activations only a
        pipeline rank's receive buffers (`received`)."""
        return MemoryEstimate(
            params=self.params,
            grads=self.grads,
            optimizer=self.optimizer + temporaries,
            activations=received,
            unsharded_params=0.0,
            grad_buffers=0.0,
            logits=0.0,
            workspace=self.workspace,
            allocator_reserve=self.allocator_reserve * (self.grads + temporaries),
            moment="optimizer step",
        )


def _activation_memory(
    setting: Setting,
    choice: Choice,
    activations: SavedActivations,
    *,
    in_flight: float,
    boundary: BoundaryTensors | None,
) -> tuple[float, float, float]:
    """(bytes of one activation unit of a micro-batch, saved activations, pipeline receive
    buffers) on one rank; `memory_moments` says what `in_flight` and `boundary` are."""
    p = setting.params
    tokens = choice.micro_batch_size * setting.seq_len
    activation_bytes = tokens * setting.act_bytes
    activation_bytes *= p.compiled_activation_memory_scale if choice.compile else p.activation_memory_scale
    saved = activations.saved * activation_bytes * in_flight
    received = 0.0
    if boundary is not None and setting.model.blocks:
        # One micro-batch's hidden states on this rank (its tensor- and context-parallel share).
        hidden = tokens * setting.model.blocks[0].input_elems * setting.act_bytes
        received = boundary.received * hidden
        saved += received + boundary.sent * hidden
    return activation_bytes, saved, received


def _gathered_and_earlier(
    setting: Setting, choice: Choice, layout: CommLayout, *, grads: float
) -> tuple[float, float, float]:
    """(parameters gathered around the loss, among the blocks, gradients of the step's earlier
    micro-batches) on one rank; `grads` is its sharded gradients."""
    unsharded = _unsharded_params(setting, choice, layout, blocks_only=False)
    block_unsharded = _unsharded_params(setting, choice, layout, blocks_only=True)
    earlier_grads = grads if choice.grad_accum_steps > 1 else 0.0
    if choice.fsdp2_pipeline:
        # Gathered after the first backward and never resharded; gradients accumulate unsharded
        # (counted whole as buffers) and only the step's last backward reduces them.
        unsharded = block_unsharded = layout.model_gather_bytes
        earlier_grads = choice.reduce_bytes * setting.model.rank_params
    return unsharded, block_unsharded, earlier_grads


def memory_moments(
    setting: Setting,
    choice: Choice,
    layout: CommLayout,
    activations: SavedActivations,
    *,
    in_flight: float = 1.0,
    boundary: BoundaryTensors | None = None,
) -> tuple[MemoryEstimate, ...]:
    """The step's candidate peaks: backward start, backward recompute (with checkpointing), and the
    optimizer step.

    `in_flight` is how many micro-batches' saved activations the rank holds at once: 1 without a
    pipeline; a pipeline rank holds the forwards its schedule runs ahead of their backwards
    (planner/cost/pipeline.py `in_flight_chunks`, over its stages). Under eager FSDP2 a pipeline
    rank also keeps its stages' parameters gathered and their gradients unsharded, in the reduce
    dtype, from the first backward until the step's one reduce-scatter (`Choice.fsdp2_pipeline`).
    `boundary`: the hidden states a pipeline rank holds for its sends and receives
    (planner/cost/pipeline.py `boundary_tensors`), counted as activations: the receive buffers at
    every moment, the outputs sent on beside the saved activations."""
    p = setting.params
    n_params = setting.model.rank_params  # this rank's tensor-parallel share
    shard = choice.mesh.fsdp_shards  # FSDP shards over dp_shard x cp
    if choice.mesh.ep > 1:  # its experts over (dp_shard x cp) / ep: `sharded_states`
        n_params = n_params * 1.0 + _local_expert_params(setting) * (shard / choice.mesh.expert_shards - 1)
    held = _Held(
        *sharded_states(setting, choice),
        workspace=p.workspace_gib * GIB,
        allocator_reserve=p.allocator_reserve,
    )
    activation_bytes, saved, received = _activation_memory(
        setting, choice, activations, in_flight=in_flight, boundary=boundary
    )
    unsharded, block_unsharded, earlier_grads = _gathered_and_earlier(
        setting, choice, layout, grads=held.grads
    )
    pb = setting.param_bytes
    # Gradients come out of backward in the compute dtype and are cast to fp32 for reduction.
    grad_buffer_bytes = (pb + choice.reduce_bytes) if pb < choice.reduce_bytes else pb
    moments = [
        # The loss runs: no gradient of this micro-batch is being reduced yet.
        held.at(
            "loss",
            grads_alive=earlier_grads,
            activations_alive=saved,
            gathered=unsharded,
            grad_buffers=0.0,
            logits=loss_bytes(setting, choice),
        ),
        # Backward starts with the head's gradient (computed by the loss) being reduced.
        held.at(
            "backward start",
            grads_alive=earlier_grads,
            activations_alive=saved,
            gathered=unsharded,
            grad_buffers=grad_buffer_bytes * layout.largest_reduce,
            logits=_backward_start_loss_bytes(setting, choice),
        ),
    ]
    if activations.recompute > 0:
        # Deeper in backward, among the blocks: their gathers and reductions, not the head's.
        moments.append(
            held.at(
                "backward recompute",
                grads_alive=max(held.grads, earlier_grads),
                activations_alive=saved + activations.recompute * activation_bytes,
                gathered=block_unsharded,
                grad_buffers=grad_buffer_bytes * layout.largest_block_reduce,
                logits=0.0,
            )
        )
    # The update's temporaries are in the states' dtype (priced for fp32).
    temporaries = p.optimizer_temp_bytes_per_param * setting.state_bytes / 4 * n_params / shard
    moments.append(held.optimizer_step(temporaries=temporaries, received=received))
    return tuple(moments)


MARGIN_DIMENSIONS = {name: axis(name).what.removesuffix("-parallel") for name in MODEL_PARALLEL_AXES}
"""The parallel dimensions whose plans may keep a margin of their own, outermost first (the name a
plan's reason uses)."""


def margin_dimension(mesh: Mesh) -> str | None:
    """The dimension whose margin a plan (or a measured run) on `mesh` falls under: its outermost
    parallel dimension (a pipeline with tensor parallelism is a pipeline plan); None with data
    parallelism alone."""
    return next((d for d in MARGIN_DIMENSIONS if getattr(mesh, d) > 1), None)


def memory_margin_for(params: CostParameters, mesh: Mesh) -> tuple[float, str]:
    """The margin a plan on `mesh` keeps on its predicted peak, and why: the memory model's measured
    error, or the wider one of the mesh's outermost parallel dimension where the corpus runs that
    used it were under-predicted by more (`CostParameters.dimension_margins`)."""
    margin, reason = params.memory_margin, params.memory_margin_reason
    dimension = margin_dimension(mesh)
    for wider in params.dimension_margins:
        if wider.dimension == dimension and wider.margin > margin:
            margin, reason = wider.margin, wider.reason
    return margin, reason


def memory_limit_gib(params: CostParameters, headroom: float, mesh: Mesh = SINGLE_RANK) -> float:
    """The largest predicted peak a plan on `mesh` may have: the usable capacity, less the user's
    headroom, shrunk by the margin the memory model's measured error calls for."""
    return params.usable_memory_gib * (1.0 - headroom) / (1.0 + memory_margin_for(params, mesh)[0])


class MemoryLimits:
    """`memory_limit_gib` per mesh, memoized: what a search, or the advice probing other clusters,
    lets a configuration peak at (the margin widens for the parallel dimensions its mesh uses)."""

    def __init__(self, params: CostParameters, headroom: float) -> None:
        self.params, self.headroom = params, headroom
        self._by_mesh: dict[Mesh, float] = {}

    def __call__(self, mesh: Mesh) -> float:
        if mesh not in self._by_mesh:
            self._by_mesh[mesh] = memory_limit_gib(self.params, self.headroom, mesh)
        return self._by_mesh[mesh]

    def overshoot_gib(self, memory: MemoryEstimate, mesh: Mesh) -> float:
        """GiB by which a configuration on `mesh` exceeds its limit (negative: it fits)."""
        return memory.total / GIB - self(mesh)


def fits_in_memory(memory: MemoryEstimate, *, limit_gib: float, ceiling_gib: float | None) -> bool:
    """The search's memory test: within `memory_limit_gib` and under the exclusive re-plan ceiling."""
    gib = memory.total / GIB
    return gib <= limit_gib and (ceiling_gib is None or gib < ceiling_gib)
