"""Pipeline parallelism (mesh.pp > 1): this rank's stages of the model, one torch
`PipelineStage` per stage over the pp group, and the plan's schedule.

Split. The model is built whole on the meta device (no memory), then pruned to this rank's share,
as torchtitan's `pipeline_module_split` does, without copying anything: the *rank model* keeps
the blocks of the stages this rank holds (`PipelineConfig.stages_of`: looped, or a V for ZBV), the
embeddings when it holds the first stage and the final norm and head when it holds the last. Its
blocks sit in a ModuleDict keyed by their index in the whole model, so every parameter keeps the
unsplit model's name (`layers.5.attention.wq.weight`): initialisation (seeded per name),
distributed checkpoints and pretrained weights see the same names as without pipelining. The
rank model is what the trainer initialises, optimises, clips and checkpoints. Each *stage module*
is a view of it: a module of the same class, with its own (empty) hooks, holding the same block
objects of one stage only; forward runs through the views (parallelize.py applies AC, TP, FSDP
and compile to each view, so each stage is an FSDP root of its own).

Loss. The last stage computes the project's sliced loss itself (its forward gets the targets as
a keyword argument: the head reads its weight inside its own forward, which is what FSDP2's hooks
and SimpleFSDP's gathers need), so the schedule's `loss_fn` only hands that loss on, and the
schedule scales the gradients by 1 / micro-batches (each micro-batch's loss is its mean: the
step's gradient is the mean's, as without pipelining).

Tied weights. A model whose output head shares the embedding's weight has it on the first and
on the last stage: as Megatron does, the last stage holds a copy of its own (initialised as the
embedding is: `init_aliases`, read by materialize), and after every step the two copies'
gradients are summed over the pipeline ranks holding them (`TiedCopies`), so the optimizer moves
both alike; the gradient norm counts the weight once. Checkpoints hold both names, as the unsplit
model's state dict does.

Micro-batches. The schedule runs the plan's `grad_accum_steps` micro-batches of
`micro_batch_size` sequences each per optimizer step; every rank of a pipeline reads the same
sequences (`distributed.data_parallel_rank`): the first stage takes the inputs, the last the targets.

Context parallelism (cp > 1) runs inside each stage, as torchtitan composes them: the stage modules
are context-parallel Llamas (`context_parallel.ContextParallelLlama`): the first stage keeps this
rank's load-balanced chunks of each micro-batch's tokens, the stage boundaries carry its T / cp
tokens' hidden states (the pp group of a rank is the ranks at its cp position), every stage's
attention all-gathers K/V over the stage's cp group, and the last stage's loss is the rank's token
mean with the cp group's mean as its value. FSDP shards over dp_shard x cp as without a pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor

from contract.parallel_config import EAGER_ONLY_SCHEDULES, PipelineConfig
from contract.plan_document import PlanError, RuntimePlan
from executor.runtime.models import GPT2, Llama

SCHEDULES: dict[str, type[PipelineScheduleSingle] | type[PipelineScheduleMulti]] = {
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
}
"""torch's schedule class per `PipelineConfig.schedule`."""

# Each built-in model's parts: (blocks attribute, modules of the first stage, of the last stage).
_PARTS: dict[type[nn.Module], tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    Llama: ("layers", ("tok_embeddings",), ("norm", "output")),
    GPT2: ("h", ("wte", "wpe"), ("ln_f", "lm_head")),
}
# Each built-in model's (embedding, output head) modules, whose weights tie_word_embeddings ties.
_TIED: dict[type[nn.Module], tuple[str, str]] = {
    Llama: ("tok_embeddings", "output"),
    GPT2: ("wte", "lm_head"),
}


def check_pipeline(plan: RuntimePlan, model: nn.Module, *, compiled: bool) -> None:
    """Refuse what this runtime cannot run under a pipeline, naming the plan field and the fix."""
    pp, pipeline = plan.config.mesh.pp, plan.config.pipeline
    assert pipeline is not None
    if type(model) not in _PARTS:
        raise PlanError(
            f"plan.config.mesh.pp: pipeline parallelism ({pp}) splits the built-in llama and gpt2 "
            f"models into stages, this model is a {type(model).__name__} (--model-factory); make a plan "
            "with pp 1"
        )
    if compiled and pipeline.schedule in EAGER_ONLY_SCHEDULES:
        # The contract refuses such plans; this is a run that asks for compile itself (--engine).
        raise PlanError(
            f"plan.config.pipeline.schedule: {pipeline.schedule} splits each backward into its input and "
            "its weight gradient, which torch cannot do through a compiled stage; run it without "
            "compiling (eager FSDP2), or make a plan with 1F1B or Interleaved1F1B"
        )


@dataclass(slots=True)
class StageSplit:
    """This rank's share of the model."""

    rank_model: nn.Module
    """Every parameter this rank holds, under the whole model's names (module docstring)."""
    stages: list[tuple[int, nn.Module]]
    """(stage index, stage module) for this rank's stages, in stage order."""
    blocks: dict[int, range]
    """The global block indices of each of this rank's stages."""


def split_model(model: nn.Module, *, pipeline: PipelineConfig, pp: int, pp_rank: int) -> StageSplit:
    """Prune `model` (built whole, typically on meta) in place to pipeline rank `pp_rank`'s stages,
    and make a view of it per stage (module docstring)."""
    blocks_attr, first_parts, last_parts = _PARTS[type(model)]
    mine = pipeline.stages_of(pp_rank, pp)
    last = pipeline.num_stages - 1
    starts = pipeline.first_blocks()
    ranges = {s: range(starts[s], starts[s] + pipeline.stage_blocks[s]) for s in mine}
    every_block = getattr(model, blocks_attr)
    kept = nn.ModuleDict({str(i): every_block[i] for s in mine for i in ranges[s]})
    setattr(model, blocks_attr, kept)
    for name in (() if 0 in mine else first_parts) + (() if last in mine else last_parts):
        setattr(model, name, None)
    embedding, head = _TIED[type(model)]
    if model.cfg.tie_word_embeddings and last in mine:
        # The last stage's copy of the tied weight: a parameter of its own, initialised as the
        # embedding's (materialize reads `init_aliases`), kept equal by `TiedCopies`.
        tied = getattr(model, head).weight
        getattr(model, head).weight = nn.Parameter(torch.empty_like(tied), requires_grad=tied.requires_grad)
        model.init_aliases = {f"{head}.weight": f"{embedding}.weight"}
    stages = []
    for s in mine:
        view = _view(model)
        setattr(view, blocks_attr, nn.ModuleDict({str(i): every_block[i] for i in ranges[s]}))
        for name in (() if s == 0 else first_parts) + (() if s == last else last_parts):
            setattr(view, name, None)
        stages.append((s, view))
    return StageSplit(rank_model=model, stages=stages, blocks=ranges)


def _view(model: nn.Module) -> nn.Module:
    """A module of `model`'s class with its plain attributes (the config) and the same children,
    but registries of its own: the hooks and wrappers FSDP, AC or compile add to one stage must
    not reach the rank model or the other stages."""
    view = type(model).__new__(type(model))
    nn.Module.__init__(view)
    fresh = set(vars(view))
    for name, value in vars(model).items():
        if name not in fresh:
            setattr(view, name, value)
    for name, child in model.named_children():
        setattr(view, name, child)
    return view


def _stage_loss(loss: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The schedule's `loss_fn`: the last stage's forward already returned its sliced loss."""
    del target  # the stage took the targets as a forward argument
    return loss


@dataclass(frozen=True, slots=True, kw_only=True)
class TiedCopies:
    """This rank's copies of a weight the unsplit model ties (the embedding's and the output
    head's): one, or both where one rank holds the first and the last stage (ZB-V's V)."""

    params: tuple[nn.Parameter, ...]
    """The embedding's copy first when this rank holds both."""
    holds_head: bool
    """Whether the last of `params` is the head's copy (this rank holds the last stage)."""
    group: dist.ProcessGroup | None
    """The ranks holding the first and the last stage at this rank's data-parallel, context- and
    tensor-parallel position (None where this rank holds both)."""

    @property
    def counted_elsewhere(self) -> tuple[nn.Parameter, ...]:
        """The head's copy: the gradient norm counts the weight once, as the embedding's."""
        return self.params[-1:] if self.holds_head else ()

    def sum_gradients(self) -> None:
        """Give every copy the weight's whole gradient: the sum of the embedding's and the head's."""
        local = [_local(p.grad) for p in self.params if p.grad is not None]
        if self.group is not None:
            dist.all_reduce(local[0], group=self.group)
        else:
            local[0].add_(local[1])
            local[1].copy_(local[0])


def _local(grad: torch.Tensor) -> torch.Tensor:
    """The tensor a gradient's shard lives in (both copies are laid out alike: the same shape,
    mesh dims and placements), to reduce in place."""
    return grad.to_local() if isinstance(grad, DTensor) else grad


def tied_copies(split: StageSplit, *, pipeline: PipelineConfig, mesh: DeviceMesh) -> TiedCopies | None:
    """Collective (every rank calls it, in step): the groups pairing each first-stage rank with
    the last-stage rank at its position, and this rank's copies (None: it holds neither)."""
    model = split.rank_model
    if not model.cfg.tie_word_embeddings:
        return None
    pp = mesh.size(0)
    first, last = pipeline.stage_ranks(pp)[0], pipeline.stage_ranks(pp)[-1]
    pp_rank = mesh.get_local_rank("pp")
    group = None
    if first != last:
        columns = mesh.mesh.reshape(pp, -1)  # column c: the pp ranks of one position (pp outermost)
        me = dist.get_rank()
        for c in range(columns.shape[1]):
            pair = dist.new_group([int(columns[first, c]), int(columns[last, c])])
            if me in (int(columns[first, c]), int(columns[last, c])):
                group = pair
    embedding, head = _TIED[type(model)]
    params = tuple(
        dict(getattr(model, name).named_parameters(recurse=False))["weight"]
        for name, rank in ((embedding, first), (head, last))
        if rank == pp_rank
    )
    return TiedCopies(params=params, holds_head=last == pp_rank, group=group) if params else None


@dataclass(slots=True, kw_only=True)
class PipelineRun:
    """This rank's stages and the schedule that runs them (one `step` per optimizer step)."""

    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    stages: list[PipelineStage]
    group: dist.ProcessGroup
    """The pp group: the ranks holding the other stages (gradient norms are summed over it)."""
    holds_first: bool
    holds_last: bool
    micro_batches: int
    loss_chunks: int
    tied: TiedCopies | None = None
    """This rank's copies of a tied weight (None: untied, or on other ranks)."""
    notes: list[str] = field(default_factory=list)

    @property
    def counted_elsewhere(self) -> tuple[nn.Parameter, ...]:
        """Parameters the gradient norm leaves out: a tied weight's second copy on this rank."""
        return self.tied.counted_elsewhere if self.tied is not None else ()

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        """Forward and backward of every micro-batch of `batch` ([micro_batches x micro_batch_size,
        seq + 1] tokens: inputs and targets); the gradients land on the stages' parameters (a tied
        weight's copies each get its whole gradient). Returns the sum of the micro-batches' mean
        losses on ranks holding the last stage, zero elsewhere."""
        loss_sum = self._run(batch, train=True)
        if self.tied is not None:
            self.tied.sum_gradients()
        return loss_sum

    def eval_loss(self, batch: torch.Tensor) -> torch.Tensor:
        """The same forward without gradients (`schedule.eval`): the loss sum, on the last stage."""
        with torch.no_grad():
            return self._run(batch, train=False)

    def _run(self, batch: torch.Tensor, *, train: bool) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        args = (inputs,) if self.holds_first else ()
        losses: list[torch.Tensor] = []
        run = self.schedule.step if train else self.schedule.eval
        # The targets go to every stage's forward (the last one's computes the loss with them) and,
        # as `target`, to the schedule, which asks for them on the last stage.
        run(
            *args,
            target=targets if self.holds_last else None,
            losses=losses,
            return_outputs=False,
            targets=targets,
            loss_chunks=self.loss_chunks,
        )
        if not losses:
            return torch.zeros((), dtype=torch.float32, device=batch.device)
        return torch.stack([loss.detach().float() for loss in losses]).sum()


def build_pipeline(
    split: StageSplit,
    forwards: list[nn.Module],
    *,
    plan: RuntimePlan,
    pp_mesh: DeviceMesh,
    device: torch.device,
    activation_dtype: torch.dtype,
    tied: TiedCopies | None,
) -> PipelineRun:
    """One `PipelineStage` per stage (`forwards[i]`: what parallelize made of `split.stages[i]`,
    e.g. its compiled wrapper) and the plan's schedule over them, with static shapes: the first
    stage takes [micro_batch_size, seq_len] token ids, every stage boundary passes this rank's
    share of the hidden states (its cp chunks of the sequence, split again over tp: sequence
    parallelism) in
    `activation_dtype`, and the last stage returns its fp32 loss."""
    cfg, training = plan.config, plan.training
    pipeline = cfg.pipeline
    assert pipeline is not None
    group = pp_mesh.get_group()
    mb, seq, hidden = cfg.micro_batch_size, training.seq_len, plan.model.hidden_size
    last = pipeline.num_stages - 1

    def meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # requires_grad says which tensors have gradients to send back (all but the token ids).
        return torch.empty(shape, dtype=dtype, device="meta", requires_grad=dtype.is_floating_point)

    # This rank's tokens of a micro-batch: its chunks of the sequence (cp), split again over tp.
    boundary = meta((mb, seq // (cfg.mesh.cp * cfg.mesh.tp), hidden), activation_dtype)
    stages = [
        PipelineStage(
            forward,
            index,
            pipeline.num_stages,
            device,
            input_args=meta((mb, seq), torch.int64) if index == 0 else boundary,
            output_args=meta((), torch.float32) if index == last else boundary,
            group=group,
        )
        for (index, _), forward in zip(split.stages, forwards, strict=True)
    ]
    schedule_class = SCHEDULES[pipeline.schedule]
    schedule = schedule_class(
        stages[0] if pipeline.stages_per_rank == 1 else stages,  # type: ignore[arg-type]
        n_microbatches=cfg.grad_accum_steps,
        loss_fn=_stage_loss,
        scale_grads=True,
    )
    indices = [index for index, _ in split.stages]
    blocks = ", ".join(f"{r.start}-{r.stop - 1}" for r in split.blocks.values())
    note = (
        f"pipeline: pp={cfg.mesh.pp} {pipeline.label()}, stages {list(pipeline.stage_blocks)} blocks; "
        f"this rank: stage(s) {', '.join(map(str, indices))} (blocks {blocks}); "
        f"{cfg.grad_accum_steps} micro-batches of {mb} per step"
    )
    return PipelineRun(
        schedule=schedule,
        stages=stages,
        group=group,
        holds_first=0 in indices,
        holds_last=last in indices,
        micro_batches=cfg.grad_accum_steps,
        loss_chunks=cfg.loss_chunks,
        tied=tied,
        notes=[note] + (["tied embedding and head: a copy on the last stage, gradients summed"]
                        if plan.model.tie_word_embeddings else []),
    )
