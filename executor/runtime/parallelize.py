"""parallelize(): Float8 conversion, tensor parallelism, expert parallelism, context parallelism,
activation checkpointing, data parallelism and compilation, in that order.

Two engines, as the plan chooses with `config.compile`:
  simple_fsdp (compile=True)   [Float8] -> TP -> EP -> CP -> AC -> SimpleFSDP parametrization -> torch.compile
  fsdp2       (compile=False)  [Float8] -> TP -> EP -> CP -> AC -> FSDP2 fully_shard per wrap unit (eager)
Pipeline parallelism (pp > 1) comes before all of them: the model is cut to this rank's stages
(`executor.runtime.pipeline`), Float8 converts the rank's share, and each stage module then gets
TP -> CP -> AC -> data parallelism -> compile as a whole model would (torchtitan's order: split first,
then parallelize every model part), each stage an FSDP root (and a compiled graph) of its own, over
the same data-parallel dims (pp is never one of them); `parallelize_pipeline` says what each engine
does under the schedule.
Float8 (`config.float8`, executor.runtime.float8) swaps the blocks' eligible linears for torchao's
float8 ones first, as torchtitan's model converters do: on the unsharded model, under the names
tensor parallelism addresses, and before FSDP2 wraps the weights (its float8 all-gather needs the
float8 weight subclass in place when fully_shard runs).
Why this order: tensor parallelism addresses submodules by name (`attention.wq`), which activation
checkpointing's wrapper would rename, and it turns parameters into tp DTensors that data
parallelism then shards further over its own mesh dims. Expert parallelism (`expert_parallel`,
ep > 1) comes right after: it keeps each MoE block's share of the routed experts (as DTensors on the
ep mesh, keeping their tp split) and swaps in the all-to-all dispatcher; the engines then shard
those experts over the data-parallel ranks left after ep (`dp_shard_mod_ep`) and the dense
parameters over all of them, as torchtitan does. Context parallelism
(`context_parallel`) changes no parameter: it swaps the forward of the root and of every attention
module (they keep their names), so the data-parallel engines shard the same parameters, over the
cp ranks too (dp_shard x cp). Activation checkpointing wraps blocks
before FSDP so FSDP's units and SimpleFSDP's reshard policy see the wrapped blocks. Compilation
comes last, over the SimpleFSDP parametrization: the parameter all-gathers (and tensor
parallelism's collectives) are then ordinary code inside the traced graph, which is what lets
AOTAutograd derive their backward reduce-scatters and inductor bucket and reorder them.
`Overrides` lets tests and debugging runs pick the other engine or switch compile off without
editing the plan (e.g. eager SimpleFSDP to separate sharding bugs from compiler bugs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.distributed._symmetric_memory import enable_symm_mem_for_group
from torch.distributed.device_mesh import DeviceMesh

from contract.plan_document import RuntimePlan
from executor.runtime.activation_checkpoint import apply_activation_checkpointing
from executor.runtime.compile import CompileSettings, apply_compile, compile_settings
from executor.runtime.context_parallel import apply_context_parallel
from executor.runtime.distributed import data_parallel_mesh, pipeline_mesh, submesh, tensor_parallel_mesh
from executor.runtime.expert_parallel import (
    ExpertMeshes,
    apply_expert_parallel,
    expert_meshes,
    expert_parallel_note,
)
from executor.runtime.float8 import Float8Conversion, after_optimizer_step, convert_to_float8
from executor.runtime.fsdp2 import apply_fsdp2, fsdp2_mesh
from executor.runtime.models import ModelParts, computes_own_loss, find_parts
from executor.runtime.models.moe import has_bias_balanced_routers, update_router_bias
from executor.runtime.pipeline import PipelineRun, build_pipeline, check_pipeline, split_model, tied_copies
from executor.runtime.simple_fsdp import apply_simple_fsdp
from executor.runtime.tensor_parallel import apply_tensor_parallel

Engine = Literal["simple_fsdp", "fsdp2"]

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PURE_BF16_NOTE = "pure bf16: parameters, gradients and optimizer states in bfloat16 (no fp32 master)"


@dataclass(frozen=True, slots=True)
class Overrides:
    """Runtime choices that deviate from the plan (all None: follow the plan)."""

    engine: Engine | None = None
    """Force SimpleFSDP or FSDP2 regardless of `config.compile`."""
    compile: bool | None = None
    """Force torch.compile on or off (SimpleFSDP only; FSDP2 here is always eager)."""
    backend: str = "inductor"
    """torch.compile backend."""
    param_dtype: torch.dtype | None = None
    """Replace the plan's param dtype (e.g. float32 on CPU)."""
    reduce_dtype: torch.dtype | None = None
    """Replace the plan's reduce dtype."""


@dataclass(slots=True)
class Parallelized:
    """The result of parallelize()."""

    module: nn.Module
    """The sharded model (parameters are DTensors); checkpoint, init and optimise this one."""
    forward: nn.Module
    """What to call in the training step: `module`, or its compiled wrapper (under a pipeline:
    `module`, which is never called: `pipeline` runs the stages)."""
    engine: Engine
    compiled: bool
    compile_settings: CompileSettings | None
    checkpointed_blocks: int
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    sync_last_micro_batch_only: bool = False
    """Replicated gradients accumulate locally and are all-reduced after the last micro-batch only
    (eager no_shard, as the planner prices it); sharded gradients are reduced every micro-batch."""
    notes: list[str] = field(default_factory=list)
    """Human-readable lines describing what was applied (logged by the trainer on rank 0)."""
    float8: Float8Conversion | None = None
    """The Float8 conversion (None: the plan's `config.float8` is `none`)."""
    after_optimizer_step: Callable[[nn.Module], None] | None = None
    """Run on `module` after each optimizer step (Float8 all-gather: precompute the weights' scales)."""
    pipeline: PipelineRun | None = None
    """pp > 1: this rank's stages and their schedule (a step runs `pipeline.step`, not `forward`);
    `module` is then this rank's share of the model, under the whole model's parameter names."""


def parallelize(
    model: nn.Module, *, plan: RuntimePlan, mesh: DeviceMesh, overrides: Overrides = Overrides()
) -> Parallelized:
    """Apply the plan's strategy to `model` (typically still on the meta device) in place; `mesh`
    is the job's (pp, dp_replicate, dp_shard, cp, tp) mesh (`distributed.build_mesh`). With pp > 1
    the model is first cut to this rank's pipeline stages (`parallelize_pipeline`)."""
    cfg = plan.config
    engine: Engine = overrides.engine or ("simple_fsdp" if cfg.compile else "fsdp2")
    compiled = engine == "simple_fsdp" and (cfg.compile if overrides.compile is None else overrides.compile)
    param_dtype = overrides.param_dtype or _DTYPES[cfg.param_dtype]
    reduce_dtype = overrides.reduce_dtype or _DTYPES[cfg.reduce_dtype]
    pure_bf16 = plan.training.state_dtype == "bfloat16" and param_dtype == torch.bfloat16
    if pure_bf16:
        # Pure bf16 training: the parameters themselves are bf16, so their gradients and the
        # optimizer's states are too, and the engines' mixed precision casts nothing.
        model.to(dtype=torch.bfloat16)
    if cfg.mesh.pp > 1:
        return parallelize_pipeline(
            model, plan=plan, mesh=mesh, overrides=overrides, engine=engine, compiled=compiled,
            param_dtype=param_dtype, reduce_dtype=reduce_dtype,
        )
    notes: list[str] = [PURE_BF16_NOTE] if pure_bf16 else []
    float8 = _convert_float8(model, plan=plan, mesh=mesh, engine=engine, notes=notes)
    applied = _apply_strategy(
        model, plan=plan, mesh=mesh, overrides=overrides, engine=engine, compiled=compiled,
        param_dtype=param_dtype, reduce_dtype=reduce_dtype,
        reshard_after_forward=cfg.reshard_after_forward, notes=notes,
    )
    return Parallelized(
        module=model,
        forward=applied.forward,
        engine=engine,
        compiled=compiled,
        compile_settings=applied.settings,
        checkpointed_blocks=applied.checkpointed_blocks,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        sync_last_micro_batch_only=engine == "fsdp2" and cfg.sharding == "no_shard",
        notes=notes,
        float8=float8,
        after_optimizer_step=_after_optimizer_step(model, float8=float8, mesh=mesh, pp=cfg.mesh.pp),
    )


def parallelize_pipeline(
    model: nn.Module,
    *,
    plan: RuntimePlan,
    mesh: DeviceMesh,
    overrides: Overrides,
    engine: Engine,
    compiled: bool,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
) -> Parallelized:
    """pp > 1: cut `model` to this rank's stages (`pipeline.split_model`), apply the strategy to
    each stage module as `parallelize` does to a whole model (Float8 on the rank's share first,
    then per stage TP -> CP -> AC -> FSDP -> compile, over the stage's data-parallel mesh: the pp
    dim is never a data-parallel one; cp runs inside each stage), and build the stages and the
    schedule over the pp group.

    What each engine does under the schedule (the planner prices it so):
      fsdp2        each stage is an FSDP root; torch's PipelineStage turns gradient sync off for
                   every micro-batch's backward but the schedule's last (`backward_maybe_with_nosync`,
                   then `perform_reduce_grad`), and the units do not reshard after forward here
                   (torchtitan's choice under pp, whatever the plan's reshard_after_forward says):
                   a stage's parameters are gathered once per step and its gradients
                   reduce-scattered once per step; in between the rank holds its stages' unsharded
                   parameters and their unsharded fp32 gradients.
      simple_fsdp  the parametrization gathers in every micro-batch's forward (and again in its
                   backward when resharding) and autograd reduce-scatters every micro-batch's
                   gradients: nothing is held between micro-batches, each pays its collectives.
    """
    cfg = plan.config
    pipeline = cfg.pipeline
    assert pipeline is not None, "pp > 1 comes with plan.config.pipeline (contract)"
    check_pipeline(plan, model, compiled=compiled)
    pp_mesh = pipeline_mesh(mesh)
    split = split_model(model, pipeline=pipeline, pp=cfg.mesh.pp, pp_rank=pp_mesh.get_local_rank())
    notes: list[str] = []
    float8 = _convert_float8(split.rank_model, plan=plan, mesh=mesh, engine=engine, notes=notes)
    # FSDP2 keeps a stage gathered from its first forward to the step's gradient reduction.
    reshard = cfg.reshard_after_forward and engine == "simple_fsdp"
    forwards, applied, checkpointed = [], None, 0
    for index, (_, stage) in enumerate(split.stages):
        stage_notes: list[str] = []
        applied = _apply_strategy(
            stage, plan=plan, mesh=mesh, overrides=overrides, engine=engine, compiled=compiled,
            param_dtype=param_dtype, reduce_dtype=reduce_dtype, reshard_after_forward=reshard,
            notes=stage_notes,
        )
        forwards.append(applied.forward)
        checkpointed += applied.checkpointed_blocks
        if index == 0:
            notes.extend(stage_notes)
    assert applied is not None
    run = build_pipeline(
        split, forwards, plan=plan, pp_mesh=pp_mesh, device=_device(mesh), activation_dtype=param_dtype,
        tied=tied_copies(split, pipeline=pipeline, mesh=mesh),
    )
    notes[:0] = run.notes
    if engine == "fsdp2":
        notes.append("FSDP2 under pp: parameters gathered once per step, gradients reduced after the "
                     "last micro-batch (no reshard after forward)")
    return Parallelized(
        module=split.rank_model,
        forward=split.rank_model,
        engine=engine,
        compiled=compiled,
        compile_settings=applied.settings,
        checkpointed_blocks=checkpointed,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        notes=notes,
        float8=float8,
        after_optimizer_step=_after_optimizer_step(
            split.rank_model, float8=float8, mesh=mesh, pp=cfg.mesh.pp
        ),
        pipeline=run,
    )


def _convert_float8(
    model: nn.Module, *, plan: RuntimePlan, mesh: DeviceMesh, engine: Engine, notes: list[str]
) -> Float8Conversion | None:
    """Float8 before everything: it swaps modules, which TP names, AC wraps and FSDP shards."""
    cfg = plan.config
    if cfg.float8 == "none":
        return None
    float8 = convert_to_float8(
        model,
        find_parts(model).blocks,
        recipe=cfg.float8,
        device=_device(mesh),
        fsdp2=engine == "fsdp2" and cfg.sharding != "no_shard",
    )
    notes.extend(float8.notes())
    return float8


def _after_optimizer_step(
    model: nn.Module, *, float8: Float8Conversion | None, mesh: DeviceMesh, pp: int
) -> Callable[[nn.Module], None] | None:
    """What runs after each optimizer step: Float8's scale precomputation and the bias-balanced MoE
    routers' bias update (`models.moe.update_router_bias`, its token counts summed over the ranks
    holding the same blocks: all of them, or with pp > 1 the ranks of this rank's stage)."""
    hooks = [hook for hook in (after_optimizer_step(float8),) if hook is not None]
    if has_bias_balanced_routers(model):
        group = None
        if pp > 1:
            stage_ranks = submesh(mesh, ("dp_replicate", "dp_shard", "cp", "tp"))
            group = stage_ranks._flatten("moe_balance").get_group()
        hooks.append(functools.partial(update_router_bias, group=group))
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def run_all(module: nn.Module) -> None:
        for hook in hooks:
            hook(module)

    return run_all


@dataclass(slots=True)
class _Applied:
    forward: nn.Module
    settings: CompileSettings | None
    checkpointed_blocks: int


def _apply_strategy(
    model: nn.Module,
    *,
    plan: RuntimePlan,
    mesh: DeviceMesh,
    overrides: Overrides,
    engine: Engine,
    compiled: bool,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
    notes: list[str],
) -> _Applied:
    """TP -> EP -> CP -> AC -> data parallelism -> compile on `model` (a whole model or one pipeline
    stage) in place; appends what it applied to `notes`."""
    cfg = plan.config

    # 1. Tensor parallelism: it names submodules that the AC wrapper would rename.
    micro_pipeline_tp = _tensor_parallel(model, plan=plan, mesh=mesh, compiled=compiled, notes=notes)

    # 1b. Expert parallelism: the rank's experts (keeping their tp split) before FSDP shards them.
    experts = _expert_parallel(model, plan=plan, mesh=mesh, notes=notes)

    # 2. Context parallelism: it swaps the root's and the attention modules' forward (not their
    # parameters), inside tensor parallelism's layout; AC and compile then wrap what it made.
    if cfg.mesh.cp > 1:
        note = apply_context_parallel(model, plan=plan, mesh=mesh)
        notes.append(note or f"context parallel: cp={cfg.mesh.cp}")
    parts = find_parts(model)

    # 3. Activation checkpointing: FSDP and compile must see the wrapped blocks.
    checkpointed = apply_activation_checkpointing(
        model,
        parts,
        mode=cfg.checkpointing.mode,
        every_k=cfg.checkpointing.every_k,
        keep_gathered_params=not reshard_after_forward,
        compiled=compiled,
        blocks=cfg.checkpointing.blocks,
    )
    notes.append(
        f"activation checkpointing: {cfg.checkpointing.mode} ({len(checkpointed)}/{len(parts.blocks)} blocks)"
    )

    # 4. Data parallelism over the data-parallel dims of the mesh (dp_shard x cp: `dp_shard_cp`).
    _data_parallel(
        model, parts, plan=plan, mesh=mesh, engine=engine, compiled=compiled, param_dtype=param_dtype,
        reduce_dtype=reduce_dtype, reshard_after_forward=reshard_after_forward,
        recomputed_blocks=checkpointed, experts=experts, notes=notes,
    )

    # 5. Compilation last, over the sharded model, so the collectives are part of the graph.
    forward, settings = model, None
    if compiled:
        settings = compile_settings(cfg, backend=overrides.backend, micro_pipeline_tp=micro_pipeline_tp)
        forward = apply_compile(model, settings)
        applied = ", ".join(f"{k}={_short(v)}" for k, v in settings.options.items()) or "defaults"
        notes.append(f"torch.compile backend={settings.backend}: {applied}")
        if settings.skipped:
            notes.append("inductor knobs not in this torch: " + ", ".join(settings.skipped))
    return _Applied(forward=forward, settings=settings, checkpointed_blocks=len(checkpointed))


def _tensor_parallel(
    model: nn.Module, *, plan: RuntimePlan, mesh: DeviceMesh, compiled: bool, notes: list[str]
) -> bool:
    """Tensor parallelism (sequence and loss parallel) over the mesh's tp dim, and async TP's
    symmetric memory where the plan asks for it: whether inductor should micro-pipeline the tp
    collectives."""
    cfg = plan.config
    if cfg.mesh.tp == 1:
        return False
    apply_tensor_parallel(model, mesh=tensor_parallel_mesh(mesh))
    notes.append(f"tensor parallel: tp={cfg.mesh.tp} (sequence parallel, loss parallel)")
    if not (cfg.async_tp and compiled):
        return False
    micro_pipeline_tp, note = enable_async_tensor_parallel(tensor_parallel_mesh(mesh))
    notes.append(note)
    return micro_pipeline_tp


def _expert_parallel(
    model: nn.Module, *, plan: RuntimePlan, mesh: DeviceMesh, notes: list[str]
) -> ExpertMeshes | None:
    """Expert parallelism over ep ranks carved out of the shard group (ep > 1): each MoE block keeps
    num_experts / ep routed experts and dispatches tokens by all-to-all (`expert_parallel`); the
    meshes the engines shard the experts over, or None without ep."""
    cfg = plan.config
    if cfg.mesh.ep == 1:
        return None
    meshes = expert_meshes(mesh, cfg.mesh, sharding=cfg.sharding)
    blocks = apply_expert_parallel(model, meshes=meshes)
    notes.append(expert_parallel_note(plan=plan, meshes=meshes, blocks=blocks))
    return meshes


def _data_parallel(
    model: nn.Module,
    parts: ModelParts,
    *,
    plan: RuntimePlan,
    mesh: DeviceMesh,
    engine: Engine,
    compiled: bool,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
    recomputed_blocks: list[nn.Module],
    experts: ExpertMeshes | None,
    notes: list[str],
) -> None:
    """The engine's sharding over the data-parallel dims (SimpleFSDP's parametrization or FSDP2's
    units; expert-parallel experts over `experts.data_parallel`), with the plan's mixed precision;
    notes what it applied and how the loss runs."""
    cfg = plan.config
    if engine == "simple_fsdp":
        apply_simple_fsdp(
            model,
            mesh=mesh,
            sharding=cfg.sharding,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            # Only the compiled partitioner can honour "re-gather in backward" (see simple_fsdp).
            reshard_after_forward=reshard_after_forward and compiled,
            recomputed_blocks=recomputed_blocks,
            experts_mesh=experts.data_parallel if experts else None,
        )
        notes.append(f"SimpleFSDP {cfg.sharding} on mesh {_mesh_str(data_parallel_mesh(mesh, cfg.sharding))}")
    else:
        dp_mesh = fsdp2_mesh(mesh, cfg.sharding)
        apply_fsdp2(
            model,
            parts=parts,
            mesh=dp_mesh,
            blocks_per_unit=cfg.blocks_per_unit,
            reshard_after_forward=reshard_after_forward,
            prefetch_depth=cfg.prefetch_depth,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            experts_mesh=experts.data_parallel if experts else None,
        )
        notes.append(
            f"FSDP2 {cfg.sharding} on mesh {_mesh_str(dp_mesh)}, {cfg.blocks_per_unit} block(s) per unit"
        )
    notes.append(f"mixed precision: params {_dt(param_dtype)}, gradient reduction {_dt(reduce_dtype)}")
    if computes_own_loss(model):
        notes.append(f"loss: output projection + cross-entropy in {cfg.loss_chunks} token slice(s)")
    else:
        notes.append("loss: unchunked cross-entropy on the model's logits (its forward takes no loss_chunks)")


def enable_async_tensor_parallel(tp_mesh: DeviceMesh) -> tuple[bool, str]:
    """Give the tp group symmetric memory, which inductor's micro-pipelined TP (`_micro_pipeline_tp`)
    needs: (whether to ask inductor for it, the note to log). Symmetric memory is CUDA's (NVLink
    peers): elsewhere (a CPU dry run of a GPU plan) the collectives run unpipelined, as the note says."""
    if tp_mesh.device_type != "cuda":
        return False, (f"async tensor parallel: not on {tp_mesh.device_type} (it needs CUDA symmetric "
                       "memory); the tp collectives run unpipelined")
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    return True, ("async tensor parallel: symmetric memory on the tp group; inductor micro-pipelines "
                  "its collectives")


def _device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def _mesh_str(mesh: DeviceMesh) -> str:
    names = mesh.mesh_dim_names or tuple(f"d{i}" for i in range(mesh.ndim))
    return " x ".join(f"{n}={s}" for n, s in zip(names, mesh.shape, strict=True))


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _short(value: object) -> str:
    keywords = getattr(value, "keywords", None)  # functools.partial bucket-cap functions
    if keywords and "cap_mib" in keywords:
        return f"{keywords['cap_mib']:.1f}MiB"
    return str(value)
