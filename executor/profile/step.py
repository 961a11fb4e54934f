"""Whole training steps of a shortened model, timed through the runtime's own step.

The GEMM, bandwidth, collective and block measurements price the model's parts; a real step also
pays for what lies between them: the optimizer and gradient clipping over sharded parameters, FSDP's
hooks, the full-vocabulary head and loss, and Python. Timing `train_step` on the model cut to one,
two (and four) blocks, with its real vocabulary, with eager FSDP2 sharding over every rank or
replicating on every rank, lets the planner fit those costs instead of assuming them. The
optimizer part is timed on its own too.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from executor.profile.blocks import model_config
from executor.profile.measure import Budget, agreed_exhausted, agreed_seconds, synchronize
from executor.runtime.distributed import DistEnv, build_mesh
from executor.runtime.materialize import materialize
from executor.runtime.models import build_model
from executor.runtime.optim import OptimizerSettings, build_optimizer
from executor.runtime.parallelize import parallelize
from executor.runtime.plan import (
    CheckpointingConfig,
    ClusterConfig,
    ParallelConfig,
    RuntimePlan,
    TrainingConfig,
)
from executor.runtime.step import train_step

# (sharding, blocks, micro-batches per step), most telling first: replicated steps (one all-reduce
# per block) at two depths price a block; sharded steps (all-gathers and reduce-scatters) then price
# the collectives in place; accumulation separates per-micro-batch from per-step costs.
SHAPES = (
    ("full_shard", 1, 1),
    ("no_shard", 1, 1),
    ("no_shard", 2, 1),
    ("full_shard", 2, 1),
    ("full_shard", 1, 2),
    ("full_shard", 4, 1),
    ("no_shard", 4, 1),
)
WARMUP_STEPS = 2
TIMED_STEPS = 7


def _plan(
    spec: dict,
    *,
    sharding: str,
    layers: int,
    accum: int,
    micro_batch: int,
    seq_len: int,
    gpus_per_node: int,
    on_gpu: bool,
) -> RuntimePlan:
    world = dist.get_world_size() if dist.is_initialized() else 1
    dtype = "bfloat16" if on_gpu else "float32"
    return RuntimePlan(
        schema_version="1.0",
        model=dataclasses.replace(model_config(spec), num_layers=layers),
        cluster=ClusterConfig(
            gpu="profile",
            num_nodes=max(1, world // gpus_per_node),
            gpus_per_node=gpus_per_node,
            world_size=world,
        ),
        training=TrainingConfig(
            seq_len=seq_len,
            global_batch_tokens=seq_len * micro_batch * accum * world,
            precision="bf16" if on_gpu else "fp32",
        ),
        config=ParallelConfig(
            sharding=sharding,  # type: ignore[arg-type]
            shard_group_size=world if sharding == "full_shard" else 1,
            replicate_group_size=1 if sharding == "full_shard" else world,
            reshard_after_forward=sharding == "full_shard",
            micro_batch_size=micro_batch,
            grad_accum_steps=accum,
            checkpointing=CheckpointingConfig(mode="none"),
            param_dtype=dtype,
            reduce_dtype="float32",
        ),
    )


def _time_steps(plan: RuntimePlan, device: torch.device, optimizer_name: str) -> tuple[float, float]:
    """Median seconds of a whole step and of its update part (clip + optimizer), slowest rank."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    env = DistEnv(rank=rank, local_rank=local_rank, world_size=world, device=device, backend="")
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    par = parallelize(model, plan=plan, mesh=build_mesh(plan, env))
    materialize(par.module, device=device, seed=0)
    optimizer = build_optimizer(
        par.module, OptimizerSettings(name=optimizer_name, warmup_steps=1), device=device
    )
    cfg = plan.config
    generator = torch.Generator().manual_seed(rank)
    batches = [
        torch.randint(
            0, plan.model.vocab_size, (cfg.micro_batch_size, plan.training.seq_len + 1), generator=generator
        ).to(device)
        for _ in range(cfg.grad_accum_steps)
    ]
    marks: list[float] = []

    def mark() -> None:
        synchronize(device)
        marks.append(time.perf_counter())

    steps, updates = [], []
    for index in range(WARMUP_STEPS + TIMED_STEPS):
        marks.clear()
        mark()
        train_step(
            par,
            optimizer,
            batches,
            grad_accum_steps=cfg.grad_accum_steps,
            max_grad_norm=1.0,
            loss_chunks=cfg.loss_chunks,
            before_update=mark,
        )
        mark()
        if index >= WARMUP_STEPS:
            steps.append(marks[2] - marks[0])
            updates.append(marks[2] - marks[1])
    return (
        agreed_seconds(statistics.median(steps), device),
        agreed_seconds(statistics.median(updates), device),
    )


def step_samples(
    spec: dict,
    *,
    seq_len: int,
    micro_batch: int,
    optimizer: str,
    gpus_per_node: int,
    device: torch.device,
    budget: Budget,
    on_sample: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """One sample per (sharding, blocks, accumulation) shape that fits in the budget and in memory."""
    samples: list[dict] = []
    if spec.get("architecture") not in ("llama", "gpt2"):
        return samples
    on_gpu = device.type == "cuda"
    world = dist.get_world_size() if dist.is_initialized() else 1
    for sharding, layers, accum in SHAPES:
        if agreed_exhausted(budget, device):
            break
        plan = _plan(
            spec,
            sharding=sharding,
            layers=layers,
            accum=accum,
            micro_batch=micro_batch,
            seq_len=seq_len,
            gpus_per_node=gpus_per_node,
            on_gpu=on_gpu,
        )
        try:
            seconds, update_seconds = _time_steps(plan, device, optimizer)
        except torch.OutOfMemoryError:
            # Same model on every rank: all run out together. Skip the shape (a replicated one may
            # not fit where a sharded one does).
            torch.cuda.empty_cache()
            continue
        samples.append(
            {
                "num_layers": layers,
                "micro_batch_size": micro_batch,
                "grad_accum_steps": accum,
                "seq_len": seq_len,
                "ranks": world,
                "sharding": sharding,
                "optimizer": optimizer,
                "dtype": plan.config.param_dtype,
                "seconds": seconds,
                "update_seconds": update_seconds,
            }
        )
        on_sample(f"training step {sharding} {layers} block(s) x{accum} micro-batch(es)")
    if dist.is_initialized():
        dist.barrier()
    return samples
