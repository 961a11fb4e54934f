"""Expert parallelism: every MoE block's routed experts split over the ep ranks, tokens sent to their
experts' ranks and back by all-to-all.

The mesh (torchtitan's `dp_shard_mod_ep` / `dp_shard_in_ep`): ep is carved out of the data-parallel
shard group (the ep axis's `carved_from`, dp_shard x cp, in `contract.mesh.AXES`), innermost, so an ep
group is ep consecutive shard ranks (with tp, the ranks of one tp coordinate: the ep group strides over
the tp ranks), and the experts are FSDP-sharded over the other `Mesh.expert_shards` (the contract's
one rule, which the planner prices too). The job's
data-parallel ranks (dp_replicate x dp_shard x cp) are unflattened into (`expert_replicate`,
`dp_shard_mod_ep`, `ep`) and, beside them, `expert_tp` (the tp ranks again, under a name of this
lineage, so the experts' 2-D (ep, tp) mesh and their data-parallel mesh share one root):
  dense parameters    FSDP-sharded over all the data-parallel ranks, as without ep
  routed experts      num_experts / ep per rank (Shard(0) on `ep`), FSDP-sharded over the ranks left
                      after ep (`dp_shard_mod_ep`, with `expert_replicate` as HSDP's replicas)
With tp > 1 the experts stay tensor-parallel too (`tensor_parallel.ExpertTensorParallel`: each
expert's hidden units split over the tp ranks, every tp rank routing the whole sequence): an expert
weight is a DTensor on (ep, expert_tp), (Shard(0), its tp placement).

A step (`AllToAllDispatcher`): sort the rank's token copies by expert, exchange the counts per
expert (all_to_all_single of [num_experts] counts: each rank learns how many rows it receives from
each peer for each of its experts), send the rows (all_to_all_single with those split sizes,
`exchange_rows`: its backward is the reverse all-to-all), reorder them from
source-rank-major to expert-major for the grouped matmul, and after the experts undo both.

Gradients: a rank's experts get the gradients of every ep peer's tokens, and the engines average
them over the `dp_shard_mod_ep` ranks only, so each expert weight's gradient is scaled by 1 / ep
(`GroupedExperts.grad_scale`): the sum over the data-parallel ranks divided by all of them, as for
the dense parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from contract.mesh import WORLD_AXES, Mesh, axis
from contract.plan_document import PlanError, RuntimePlan
from executor.runtime.distributed import submesh
from executor.runtime.models.moe import Dispatched, LocalDispatcher, moe_layers

_SHARD_GROUP = axis("ep").carved_from
"""The world axes whose ranks the ep groups are carved out of (dp_shard x cp)."""
_EXPERT_AXES = ("dp_replicate", *_SHARD_GROUP, "tp")
"""The world axes unflattened into EXPERT_DIMS: the replicas, the shard group, the tp ranks."""
EXPERT_DIMS = ("expert_replicate", "dp_shard_mod_ep", "ep", "expert_tp")
"""The dims the data-parallel and tp ranks are unflattened into for the experts (see the docstring)."""


class ExpertMeshes(NamedTuple):
    """The meshes of expert parallelism (all from one unflattened mesh: one root)."""

    ep: DeviceMesh
    """1-D: this rank's ep group (the all-to-alls); 2-D (ep, expert_tp) with tp > 1 (the experts'
    DTensor mesh)."""
    group: DeviceMesh
    """1-D: the ep group (its process group runs the all-to-alls; a mesh, not the group itself, as
    these meshes are kept on the job's mesh, which the compiler's guards deep-copy)."""
    data_parallel: DeviceMesh
    """Where FSDP shards the experts: `dp_shard_mod_ep`, or (expert_replicate, dp_shard_mod_ep) for
    hybrid_shard."""


def expert_meshes(mesh: DeviceMesh, plan_mesh: Mesh, *, sharding: str) -> ExpertMeshes:
    """The expert-parallel meshes of the job's (pp, dp_replicate, dp_shard, cp, tp) `mesh`, laid out
    as the plan's `plan_mesh` says (its ep, and `expert_shards` ranks per expert-sharded FSDP group);
    made once per mesh and kept on it: every rank makes the same collective calls, in step."""
    ep = plan_mesh.ep
    made: dict[tuple[int, str], ExpertMeshes] = mesh.__dict__.setdefault("_fsdp_planner_experts", {})
    if (ep, sharding) in made:
        return made[(ep, sharding)]
    sizes = tuple(mesh.size(WORLD_AXES.index(name)) for name in WORLD_AXES)
    if sizes != plan_mesh.shape or plan_mesh.expert_shards * ep != plan_mesh.fsdp_shards:
        raise PlanError(
            f"plan.config.mesh: {plan_mesh.describe()} cannot be laid on this job's device mesh "
            f"{dict(zip(WORLD_AXES, sizes, strict=True))} (ep must divide "
            f"{' x '.join(_SHARD_GROUP)}: its ranks are carved out of them)"
        )
    flat = submesh(mesh, _EXPERT_AXES)._flatten("_x_".join(_EXPERT_AXES))
    shape = (plan_mesh.dp_replicate, plan_mesh.expert_shards, ep, plan_mesh.tp)
    experts = flat._unflatten(0, shape, EXPERT_DIMS)
    ep_mesh = experts["ep", "expert_tp"] if plan_mesh.tp > 1 else experts["ep"]
    replicas = sharding == "hybrid_shard" and plan_mesh.dp_replicate > 1
    data_parallel = experts["expert_replicate", "dp_shard_mod_ep"] if replicas else experts["dp_shard_mod_ep"]
    made[(ep, sharding)] = ExpertMeshes(ep_mesh, experts["ep"], data_parallel)
    return made[(ep, sharding)]


def apply_expert_parallel(model: nn.Module, *, meshes: ExpertMeshes) -> int:
    """Give every MoE block of `model` (on the meta device, after tensor parallelism) its rank's
    experts and the all-to-all dispatcher, in place: the routed experts' parameters become DTensors
    sharded by expert (Shard(0)) over the ep ranks (keeping a tensor-parallel placement on the
    `expert_tp` dim). Returns the number of MoE blocks."""
    ep = meshes.ep.size(0)
    layers = moe_layers(model)
    for layer in layers:
        if layer.num_experts % ep:
            raise PlanError(
                f"plan.config.mesh.ep: {layer.num_experts} experts do not split evenly over ep {ep}"
            )
        experts = layer.experts
        for name, param in list(experts.named_parameters(recurse=False)):
            experts.register_parameter(
                name, nn.Parameter(_shard_by_expert(param, meshes.ep), requires_grad=param.requires_grad)
            )
        experts.grad_scale = 1.0 / ep
        layer.dispatcher = AllToAllDispatcher(group=meshes.group.get_group(), ep=ep)
    return len(layers)


def _shard_by_expert(param: torch.Tensor, ep_mesh: DeviceMesh) -> DTensor:
    """`param` [num_experts, ...] (plain, or a DTensor on the tp mesh) as a DTensor on the expert
    mesh: Shard(0) on ep, then its tp placement on expert_tp."""
    if not isinstance(param, DTensor):
        return distribute_tensor(param.detach(), ep_mesh, [Shard(0)], src_data_rank=None)
    ep_rank, ep = ep_mesh.get_local_rank(0), ep_mesh.size(0)
    local = param.to_local().detach().chunk(ep, dim=0)[ep_rank]
    placements = (Shard(0), *param.placements)
    return DTensor.from_local(
        local, ep_mesh, placements, run_check=False, shape=param.shape, stride=param.stride()
    )


class EpDispatched(NamedTuple):
    """What `AllToAllDispatcher.dispatch` hands the experts, and what its `combine` needs back."""

    rows: torch.Tensor
    """The rows this rank's experts run, expert-major [received, hidden]."""
    tokens_per_expert: torch.Tensor
    """Rows per local expert [num_experts / ep] (int64)."""
    local: Dispatched
    """This rank's own token copies sorted by (global) expert, as `LocalDispatcher` sorts them."""
    received_order: torch.Tensor
    """rows[i] is received row received_order[i] (the received rows are source-rank-major)."""
    send_splits: list[int]
    """Rows sent to each ep peer."""
    receive_splits: list[int]
    """Rows received from each ep peer."""


class AllToAllDispatcher(LocalDispatcher):
    """Expert-parallel dispatch and combine over the ep group's `all_to_all_single` (the seam of
    `models.moe.LocalDispatcher`): the rank holds experts [rank x E/ep, (rank + 1) x E/ep)."""

    def __init__(self, *, group: dist.ProcessGroup, ep: int) -> None:
        self.group, self.ep = group, ep
        self.group_name = group.group_name

    def dispatch(self, x: torch.Tensor, experts: torch.Tensor, num_experts: int) -> EpDispatched:  # type: ignore[override]
        local = super().dispatch(x, experts, num_experts)
        with torch.no_grad():
            # received[s * E/ep + e]: rows peer s sends for this rank's e-th expert.
            received = all_to_all_single(local.tokens_per_expert, None, None, self.group)
            received = torch.ops._c10d_functional.wait_tensor(received)
            per_peer = received.view(self.ep, -1)
            # The split sizes are read on the host: the all-to-all's buffers are sized by them.
            send_splits = local.tokens_per_expert.view(self.ep, -1).sum(1).tolist()
            receive_splits = per_peer.sum(1).tolist()
        rows = exchange_rows(local.rows, receive_splits, send_splits, self.group_name, sum(receive_splits))
        with torch.no_grad():
            order = _expert_major_order(per_peer, rows.shape[0])
        return EpDispatched(
            rows=rows[order],
            tokens_per_expert=per_peer.sum(0),
            local=local,
            received_order=order,
            send_splits=send_splits,
            receive_splits=receive_splits,
        )

    def combine(self, out: torch.Tensor, dispatched: EpDispatched, weights: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Expert outputs (expert-major) back to their source ranks, then `LocalDispatcher.combine`."""
        received = torch.zeros_like(out).index_copy(0, dispatched.received_order, out)
        back = exchange_rows(
            received, dispatched.send_splits, dispatched.receive_splits, self.group_name,
            dispatched.local.rows.shape[0],  # every copy comes back: the rank's tokens x k
        )
        return super().combine(back, dispatched.local, weights)


@torch.library.custom_op("fsdp_planner::exchange_rows", mutates_args=())
def exchange_rows(
    rows: torch.Tensor, receive: list[int], send: list[int], group_name: str, received: int
) -> torch.Tensor:
    """All-to-all of `rows` [sum(send), width] over the process group `group_name`: send[i] rows to
    peer i, receive[i] from it, in peer order; `received` is sum(receive), given apart so that the
    combine's exchange back says it is the rank's own (static) number of token copies.

    A custom operator (its backward the reverse exchange) rather than the functional collective:
    the compiler sees one opaque op whose output size is the one it is told, instead of an
    all-to-all whose data-dependent sizes inductor's collective bucketing cannot hint."""
    out = rows.new_empty(received, rows.shape[1])
    dist.all_to_all_single(out, rows.contiguous(), receive, send, group=_resolve_process_group(group_name))
    return out


@exchange_rows.register_fake
def _(
    rows: torch.Tensor, receive: list[int], send: list[int], group_name: str, received: int
) -> torch.Tensor:
    return rows.new_empty(received, rows.shape[1])


def _exchange_setup(ctx, inputs: tuple, output: torch.Tensor) -> None:
    rows, ctx.receive, ctx.send, ctx.group_name, _ = inputs
    ctx.rows = rows.shape[0]


def _exchange_backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
    back = exchange_rows(grad, ctx.send, ctx.receive, ctx.group_name, ctx.rows)
    return back, None, None, None, None


exchange_rows.register_autograd(_exchange_backward, setup_context=_exchange_setup)


def _expert_major_order(per_peer: torch.Tensor, rows: int) -> torch.Tensor:
    """The received rows' order expert-major: per_peer [ep, local experts] counts the `rows` rows
    from each peer for each local expert, received peer-major (peer 0's rows for expert 0, 1, ...,
    then peer 1's); the grouped matmul wants every row of expert 0 (peers in order), then expert 1's.
    Tensor ops only (no host loop over the counts), so that the compiler traces it with `rows` as
    the one data-dependent size."""
    counts = per_peer.flatten()
    starts = (torch.cumsum(counts, 0) - counts).view_as(per_peer).t().flatten()  # segment starts
    lengths = per_peer.t().flatten()  # expert-major segments
    segments = torch.arange(lengths.numel(), device=counts.device)
    segment = torch.repeat_interleave(segments, lengths, output_size=rows)  # each output row's
    placed = torch.cumsum(lengths, 0) - lengths  # where each segment starts in the output
    return starts[segment] + torch.arange(rows, device=counts.device) - placed[segment]


def expert_parallel_note(*, plan: RuntimePlan, meshes: ExpertMeshes, blocks: int) -> str:
    """What the trainer logs: the ep groups, what each rank holds, and the experts' FSDP mesh."""
    mesh = plan.config.mesh
    moe = plan.model.moe
    experts = moe.num_experts // mesh.ep if moe is not None else 0
    data_parallel = meshes.data_parallel
    names = data_parallel.mesh_dim_names or ()
    over = " x ".join(f"{name}={size}" for name, size in zip(names, data_parallel.shape, strict=True))
    tp = f", each split over tp {mesh.tp}" if mesh.tp > 1 else ""
    return (
        f"expert parallel: ep={mesh.ep} ({blocks} MoE blocks, {experts} routed experts per rank{tp}, "
        f"tokens dispatched by all-to-all); experts FSDP-sharded on mesh {over}"
    )
