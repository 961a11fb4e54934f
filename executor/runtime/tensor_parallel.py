"""Tensor parallelism for the built-in Llama: Megatron-style column/row-parallel matmuls, sequence
parallelism between them, and a vocabulary-parallel (loss-parallel) output head.

Layouts on the tp mesh (T ranks), per block:
  attention_norm, ffn_norm    SequenceParallel: each rank normalises its 1/T of the sequence
  attention / feed_forward    input all-gathered over the sequence (PrepareModuleInput)
  wq, wk, wv, w1, w3          ColwiseParallel: output features (heads, ffn) split, no communication
  wo, w2                      RowwiseParallel: partial sums reduce-scattered back onto the sequence
and around the blocks:
  tok_embeddings              vocabulary rows split; the partial embeddings are reduce-scattered
                              onto the sequence (the residual stream is sequence-sharded throughout)
  norm                        SequenceParallel
  output                      vocabulary rows split; the loss is computed without ever gathering
                              the logits (`VocabParallelOutputHead`, `loss.py`)

The attention module reshapes by its local projection width, so each rank runs num_heads / T query
heads and num_kv_heads / T key/value heads. This module only lays out parameters and activations;
the data-parallel engines (`simple_fsdp`, `fsdp2`) shard the resulting tp DTensors further.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from contract.plan_document import PlanError
from executor.runtime.loss import VocabShard, vocab_parallel_linear_cross_entropy
from executor.runtime.models.common import OutputHead, blocks_in_order
from executor.runtime.models.llama import Llama
from executor.runtime.models.moe import MoEFeedForward


def apply_tensor_parallel(model: nn.Module, *, mesh: DeviceMesh) -> None:
    """Shard `model` (the built-in Llama, typically on the meta device) over the 1-D tp `mesh` in place."""
    if not isinstance(model, Llama):
        raise PlanError(
            f"plan.config.mesh.tp: tensor parallelism ({mesh.size()}) is implemented for the built-in "
            f"llama model only, this model is a {type(model).__name__}; make a plan with tp 1"
        )
    for block in blocks_in_order(model.layers):
        latent = model.cfg.latent_attention
        styles = _block_plan(
            qk_norm=model.cfg.qk_norm,
            moe=isinstance(block.feed_forward, MoEFeedForward),
            latent=latent is not None,
            q_lora=latent is not None and latent.q_lora_rank is not None,
        )
        parallelize_module(block, mesh, styles)
    around: dict[str, ParallelStyle] = {
        # Vocabulary-sharded lookup; Shard(1) output: the residual stream is sequence-parallel.
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": VocabParallelHead(),
    }
    # A pipeline stage holds the embeddings, the head, both or neither (its blocks then take and
    # return the sequence-parallel shard of the residual stream).
    present = {name: style for name, style in around.items() if getattr(model, name) is not None}
    if present:
        parallelize_module(model, mesh, present)
    if model.cfg.tie_word_embeddings and model.tok_embeddings is not None and model.output is not None:
        # Both halves of a tied weight are split by vocabulary rows: one DTensor serves both.
        model.output.weight = model.tok_embeddings.weight


def _block_plan(
    *, qk_norm: bool = False, moe: bool = False, latent: bool = False, q_lora: bool = False
) -> dict[str, ParallelStyle]:
    """One transformer block: sequence-parallel norms around column- then row-parallel matmuls.
    Query/key norms normalise each of the rank's heads ([batch, seq, heads / T, head_dim]): their
    weight is replicated like a sequence-parallel norm's, with the heads (dim 2) as the sharded dim,
    so its gradient is summed over the tp ranks' heads. A mixture-of-experts feed-forward is laid out
    by `ExpertTensorParallel`; latent attention splits its heads (wq / wq_b, wkv_b column-parallel)
    and replicates its down projections and their norms (`models.latent_attention`)."""
    # Attention's forward is (x, rope): only x is a tensor to lay out.
    gather_attention_input = PrepareModuleInput(
        input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
    )
    gather_ffn_input = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    head_norm = SequenceParallel(sequence_dim=2, use_local_output=True)
    head_norms = {"attention.q_norm": head_norm, "attention.k_norm": head_norm} if qk_norm else {}
    if latent:
        replicated = ReplicateParameters()
        queries: dict[str, ParallelStyle] = {"attention.wq": ColwiseParallel()}
        if q_lora:
            queries = {"attention.wq_a": replicated, "attention.q_norm": replicated}
            queries["attention.wq_b"] = ColwiseParallel()
        projections: dict[str, ParallelStyle] = {
            **queries,
            "attention.wkv_a": replicated,
            "attention.kv_norm": replicated,
            "attention.wkv_b": ColwiseParallel(),
        }
    else:
        projections = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
        }
    return {
        "attention_norm": SequenceParallel(),
        "attention": gather_attention_input,
        **projections,
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        **head_norms,
        **(
            {"feed_forward": ExpertTensorParallel()}
            if moe
            else {
                "feed_forward": gather_ffn_input,
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            }
        ),
    }


class ReplicateParameters(ParallelStyle):
    """Every parameter of the module replicated on the tp mesh (a DTensor: its gradient, partial on
    each rank, is summed over the ranks); its input is a replicated DTensor already."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, param in list(mod.named_parameters(recurse=False)):
                tensor = distribute_tensor(param, mesh, [Replicate()], src_data_rank=None)
                mod.register_parameter(pname, nn.Parameter(tensor, requires_grad=param.requires_grad))

        distribute_module(module, device_mesh, replicate)
        return module


_EXPERT_SPLITS: dict[str, Placement] = {
    "experts.w1": Shard(2), "experts.w3": Shard(2), "experts.w2": Shard(1),
    "experts.b1": Shard(1), "experts.b3": Shard(1),
    "shared.w1.weight": Shard(0), "shared.w3.weight": Shard(0), "shared.w2.weight": Shard(1),
}
"""The MoE feed-forward's tensor-parallel splits by parameter name (the others are replicated)."""


class ExpertTensorParallel(ParallelStyle):
    """A mixture-of-experts feed-forward (`models.moe.MoEFeedForward`) split like a dense MLP: every
    routed expert's w1/w3 by its hidden columns (Shard(2) of [E, hidden, ffn], biases Shard(1)), w2 by
    its rows (Shard(1) of [E, ffn, hidden]), the shared experts' linears column- then row-wise; the
    router (and the experts' output bias) replicated. The input is gathered over the sequence; every
    rank routes all tokens the same way, runs its share of each expert's hidden units, and the partial
    sums are reduce-scattered back onto the sequence (`MoEFeedForward.forward`)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, MoEFeedForward) or device_mesh.ndim != 1:
            raise ValueError(f"ExpertTensorParallel applies to an MoEFeedForward on a 1-D mesh, got {module}")
        tp = device_mesh.size()
        for name, param in module.named_parameters():
            split = _EXPERT_SPLITS.get(name)
            if split is not None and param.shape[split.dim] % tp:
                raise PlanError(
                    f"plan.model.moe: {name} {tuple(param.shape)} does not split evenly over tp {tp}"
                )
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        gather._apply(module, device_mesh)

        def split(prefix: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for name, param in list(mod.named_parameters(recurse=False)):
                placement = _EXPERT_SPLITS.get(f"{prefix}.{name}" if prefix else name, Replicate())
                tensor = distribute_tensor(param, mesh, [placement], src_data_rank=None)
                mod.register_parameter(name, nn.Parameter(tensor, requires_grad=param.requires_grad))

        # distribute_module replicates buffers too: the router's bias and token counts stay plain
        # tensors (the same on every rank, updated by `moe.update_router_bias` over all ranks).
        buffers = [(m, name, b) for m in module.modules() for name, b in m._buffers.items() if b is not None]
        distribute_module(module, device_mesh, split)
        for owner, name, buffer in buffers:
            owner._buffers[name] = buffer
        for part in (module, module.router, module.experts):
            part.tp = tp
        return module


class VocabParallelHead(ParallelStyle):
    """Loss parallelism for an `OutputHead`: its weight split by vocabulary rows (Shard(0)), its
    forward replaced by `VocabParallelOutputHead.forward`."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, OutputHead) or device_mesh.ndim != 1:
            raise ValueError(f"VocabParallelHead applies to an OutputHead on a 1-D mesh, got {module}")
        vocab = module.weight.shape[0]
        if vocab % device_mesh.size():
            raise ValueError(f"vocabulary {vocab} does not split evenly over {device_mesh.size()} ranks")

        def shard_rows(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            weight = distribute_tensor(mod.weight, mesh, [Shard(0)], src_data_rank=None)
            mod.register_parameter("weight", nn.Parameter(weight, requires_grad=mod.weight.requires_grad))

        distribute_module(module, device_mesh, shard_rows)
        module.__class__ = VocabParallelOutputHead
        module.vocab = VocabShard(  # type: ignore[attr-defined]
            group=device_mesh.get_group().group_name,
            start=device_mesh.get_local_rank() * (vocab // device_mesh.size()),
        )
        return module


class VocabParallelOutputHead(OutputHead):
    """The output head of a tensor-parallel model: the weight (a DTensor on the tp mesh, as FSDP2
    or SimpleFSDP hand it to forward) holds this rank's vocabulary rows `vocab.start...`; the
    input is the sequence-sharded final norm output.

    Made from an `OutputHead` by `VocabParallelHead` (the same module, parameter name and tying).
    """

    vocab: VocabShard
    """This rank's vocabulary rows and the tp group (plain attributes: constants to the compiler)."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, targets: torch.Tensor | None = None, *, chunks: int = 1
    ) -> torch.Tensor:
        weight = self.weight
        if not isinstance(x, DTensor) or not isinstance(weight, DTensor):
            raise TypeError("the vocabulary-parallel head expects DTensor inputs and weight on the tp mesh")
        if targets is None:
            # Logits for inspection and tests, not training: gathered whole (vocabulary-sized).
            logits = F.linear(x.redistribute(placements=[Replicate()]), weight)
            return logits.full_tensor()
        return vocab_parallel_linear_cross_entropy(
            gather_sequence(x), weight.to_local(), targets, chunks=chunks, vocab=self.vocab
        )


def gather_sequence(x: DTensor) -> torch.Tensor:
    """The whole sequence's hidden states from sequence-parallel `x` (an all-gather), as a plain
    tensor whose gradient is declared partial: backward then reduce-scatters it, which both sums
    the tp ranks' shares of the hidden-state gradient (each rank's vocabulary shard contributes
    one) and returns each rank its own sequence shard."""
    return x.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])
