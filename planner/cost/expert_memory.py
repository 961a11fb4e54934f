"""What of a mixture-of-experts plan's peak memory is its routed experts' and their dispatch buffers':
parts of the memory estimate's terms (planner/cost/memory.py), shown apart from the dense parts (the
plan's `Prediction.expert_memory_gib`). They split the same estimate, adding nothing to it.

Without expert parallelism FSDP shards the experts like every parameter, so their share of the
sharded states is their share of the parameters (with it too: each rank's num_experts / ep experts
over (dp_shard x cp) / ep shards hold as much); of the gathered parameters (and the gradient
buffers), their share of the largest unit, an MoE block (its num_experts / ep local experts); of
the activations, what the routed rows keep for backward under the plan's checkpointing, worked out by
`saved_activations` itself over the blocks' routed parts. Pipeline ranks are taken as holding the
model's mix of dense and MoE blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.cost.memory import MemoryEstimate, SavedActivations, saved_activations
from planner.cost.model_costs import ModelCosts, UnitCost, expert_parallel_share, tensor_parallel_share
from planner.cost.setting import Choice, Setting


@dataclass(frozen=True, slots=True)
class ExpertParts:
    """Bytes per GPU at the peak's moment, each a part of the estimate's terms."""

    states: float
    """Of the parameters, gradients and optimizer states: the routed experts'."""
    gathered: float
    """Of the gathered parameters and gradient buffers: the routed experts'."""
    activations: float
    """Of the activations: the routed experts' own (SwiGLU intermediates, router scores)."""
    dispatch: float
    """Of the activations: the dispatch buffers (rows gathered for the experts, their outputs)."""


def expert_parts(setting: Setting, choice: Choice, memory: MemoryEstimate) -> ExpertParts | None:
    """The routed experts' parts of `memory` (the plan's peak), or None for a dense model."""
    model = setting.model
    if not model.has_routed_experts:
        return None
    states_share = sum(b.expert_params for b in model.blocks) / model.num_params
    largest = max(model.blocks, key=lambda b: b.num_params)
    gathered_share = largest.expert_params / largest.num_params
    if choice.mesh.ep > 1:  # a rank gathers its num_experts / ep experts only
        local = largest.expert_params / choice.mesh.ep
        gathered_share = local / (largest.num_params - largest.expert_params + local)
    ranked = replace(
        setting, model=expert_parallel_share(tensor_parallel_share(model, choice.mesh.tp), choice.mesh.ep)
    )
    whole = saved_activations(ranked, choice)
    recompute = memory.moment == "backward recompute"

    def share_of(field: str) -> float:
        part = saved_activations(replace(ranked, model=_routed_only(ranked.model, field)), choice)
        return _kept(part, recompute) / _kept(whole, recompute) if _kept(whole, recompute) else 0.0

    return ExpertParts(
        states=(memory.params + memory.grads + memory.optimizer) * states_share,
        gathered=(memory.unsharded_params + memory.grad_buffers) * gathered_share,
        activations=memory.activations * share_of("expert_saved_elems"),
        dispatch=memory.activations * share_of("dispatch_elems"),
    )


def _kept(saved: SavedActivations, recompute: bool) -> float:
    return saved.saved + (saved.recompute if recompute else 0.0)


_OP_PARTS = {"expert_saved_elems": "op_routing_elems", "dispatch_elems": "exchange_elems"}
"""What op-level checkpointing keeps of each part: the router's top-k and GEMM output; of the
dispatch buffers, the expert-parallel all-to-alls' outputs (in `op_saved_elems` once ep > 1)."""


def _routed_only(model: ModelCosts, field: str) -> ModelCosts:
    """The model with each block keeping only its `field` part of what it saves (and of what op-level
    checkpointing keeps), the head nothing: what `saved_activations` then counts is that part's,
    under the same checkpointing."""
    parts: dict[int, UnitCost] = {}

    def routed(block: UnitCost) -> UnitCost:
        if id(block) not in parts:
            elems = getattr(block, field)
            op_elems = getattr(block, _OP_PARTS[field])
            if field == "dispatch_elems" and model.expert_parallel == 1:
                op_elems = 0.0  # the local dispatch keeps nothing under op-level checkpointing
            parts[id(block)] = replace(
                block, saved_elems=elems, compiled_saved_elems=elems, saved_fp32_elems=0.0,
                op_saved_elems=op_elems, input_elems=0.0, attention_output_elems=0.0,
                gathered_elems=0.0, tp_collective_elems=0.0, kv_elems=0.0,
            )
        return parts[id(block)]

    head = replace(model.head, saved_elems=0.0, compiled_saved_elems=0.0, saved_fp32_elems=0.0)
    return replace(model, blocks=tuple(routed(b) for b in model.blocks), head=head)
