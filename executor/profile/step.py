"""Whole training steps of a shortened model, timed through the runtime's own step.

The GEMM, bandwidth, collective and block measurements price the model's parts; a real step also
pays for what lies between them: the optimizer and gradient clipping over sharded parameters, FSDP's
hooks, the full-vocabulary head and loss, and Python. Timing `train_step` on the model cut to one,
two (and four) blocks, with its real vocabulary, with eager FSDP2 sharding over every rank or
replicating on every rank, lets the planner fit those costs instead of assuming them. The
optimizer part is timed on its own too. A few shapes run compiled (SimpleFSDP + torch.compile, the
runtime's own `parallelize` with `compile=True`) so compiled step time is calibrated too, and one
eager shape checkpoints every block.

Every shape also records its peak memory over the timed steps (all after the first update, so
optimizer state exists): on CUDA the allocator's peak allocated and reserved bytes; on CPU the
runtime's own measurement (`MemoryMeter`: persistent bytes + the profiler's peak net allocation) of
one extra step, untimed because the profiler slows it, with reserved equal to allocated.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from contract.loss_slices import loss_chunks_for
from contract.mesh import Mesh
from contract.parallel_config import CheckpointingConfig, InductorConfig, ParallelConfig
from contract.plan_document import SCHEMA_VERSION, ClusterConfig, RuntimePlan, TrainingConfig
from executor.profile.blocks import model_config
from executor.profile.measure import Budget, agreed_exhausted, agreed_seconds, synchronize
from executor.runtime.distributed import DistEnv, build_mesh
from executor.runtime.materialize import materialize
from executor.runtime.metrics import GIB, MemoryMeter, persistent_bytes
from executor.runtime.models import build_model
from executor.runtime.optim import OptimizerSettings, build_optimizer
from executor.runtime.parallelize import parallelize
from executor.runtime.step import train_step


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """One timed configuration of the cut model."""

    sharding: str
    layers: int
    accum: int = 1
    compile: bool = False
    checkpointing: str = "none"

    def describe(self) -> str:
        engine = "compiled" if self.compile else "eager"
        ac = f" AC={self.checkpointing}" if self.checkpointing != "none" else ""
        return f"training step {engine} {self.sharding} {self.layers} block(s) x{self.accum}{ac}"


# Eager shapes, most telling first: replicated steps (one all-reduce per block) at two depths price a
# block; sharded steps (all-gathers and reduce-scatters) then price the collectives in place;
# accumulation separates per-micro-batch from per-step costs; full checkpointing shows the memory
# model an activation-checkpointing mode.
# Most telling first, as a short budget reaches only the head of the list: replicated steps at 1 and
# 4 blocks (the widest depth spread prices a block against noise), the sharded ones beside them,
# then accumulation and checkpointing.
SHAPES = (
    Shape("full_shard", 1),
    Shape("no_shard", 1),
    Shape("no_shard", 4),
    Shape("full_shard", 4),
    Shape("no_shard", 2),
    Shape("full_shard", 1, accum=2),
    Shape("full_shard", 2, checkpointing="full"),
    Shape("full_shard", 2),
)
# Compiled shapes: each pays a compilation (tens of seconds on CPU), so few and small.
COMPILED_SHAPES = (
    Shape("full_shard", 1, compile=True),
    Shape("no_shard", 1, compile=True),
)
COMPILED_SHARE = 0.5
"""Share of the steps budget kept for the compiled shapes (eager shapes leave theirs unused)."""
WARMUP_STEPS = 2
TIMED_STEPS = 7


def _plan(
    spec: dict,
    *,
    shape: Shape,
    micro_batch: int,
    seq_len: int,
    gpus_per_node: int,
    on_gpu: bool,
) -> RuntimePlan:
    world = dist.get_world_size() if dist.is_initialized() else 1
    dtype = "bfloat16" if on_gpu else "float32"
    sharded = shape.sharding == "full_shard"
    model = dataclasses.replace(model_config(spec), num_layers=shape.layers)
    return RuntimePlan(
        schema_version=SCHEMA_VERSION,
        model=model,
        cluster=ClusterConfig(
            gpu="profile",
            num_nodes=max(1, world // gpus_per_node),
            gpus_per_node=gpus_per_node,
            world_size=world,
        ),
        training=TrainingConfig(
            seq_len=seq_len,
            global_batch_tokens=seq_len * micro_batch * shape.accum * world,
            precision="bf16" if on_gpu else "fp32",
        ),
        config=ParallelConfig(
            sharding=shape.sharding,  # type: ignore[arg-type]
            mesh=Mesh(dp_shard=world) if sharded else Mesh(dp_replicate=world),
            reshard_after_forward=sharded,
            micro_batch_size=micro_batch,
            grad_accum_steps=shape.accum,
            checkpointing=CheckpointingConfig(mode=shape.checkpointing),  # type: ignore[arg-type]
            param_dtype=dtype,
            reduce_dtype="float32",
            compile=shape.compile,
            # One collective per block, no inductor bucketing or reordering: the profile times the
            # kernels and collectives one by one, as the cost model prices them.
            blocks_per_unit=1,
            all_gather_bucket_mb=0.0,
            reduce_scatter_bucket_mb=0.0,
            prefetch_depth=1,
            # The loss sliced as plans slice it: its memory is then what a plan's is, and the
            # activations are what the step's transient memory mostly holds (the memory fit reads
            # their scale from it).
            loss_chunks=loss_chunks_for(micro_batch * seq_len, model.vocab_size, 2 if on_gpu else 4),
            inductor=InductorConfig(
                bucket_all_gathers=False, bucket_reduce_scatters=False,
                reorder_for_compute_comm_overlap=False,
            ),
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class StepMeasurement:
    """What one shape measured (slowest rank for times, largest rank for memory)."""

    seconds: float
    update_seconds: float
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    state_bytes: int
    memory_source: str | None


def _agreed_max(values: list[int], device: torch.device) -> list[int]:
    """Element-wise maximum over ranks (memory is judged by the fullest rank)."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def _time_steps(plan: RuntimePlan, device: torch.device, optimizer_name: str) -> StepMeasurement:
    """Median seconds of a whole step and of its update part (clip + optimizer), and peak memory."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        # The caching allocator keeps the blocks of the shape measured before this one: without
        # handing them back, this shape's reserved peak would be the largest earlier shape's.
        gc.collect()
        torch.cuda.empty_cache()
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

    def step(before_update: Callable[[], None] = lambda: None) -> None:
        train_step(
            par,
            optimizer,
            batches,
            grad_accum_steps=cfg.grad_accum_steps,
            max_grad_norm=1.0,
            loss_chunks=cfg.loss_chunks,
            before_update=before_update,
        )

    on_gpu = device.type == "cuda"
    steps, updates = [], []
    for index in range(WARMUP_STEPS + TIMED_STEPS):
        if index == WARMUP_STEPS and on_gpu:
            # Peaks over the timed steps only: optimizer state exists from here on, and the
            # compiler's first-step work (autotuning buffers) is not a training step's memory.
            torch.cuda.reset_peak_memory_stats(device)
        marks.clear()
        mark()
        step(mark)
        mark()
        if index >= WARMUP_STEPS:
            steps.append(marks[2] - marks[0])
            updates.append(marks[2] - marks[1])
    state = persistent_bytes(par.module, optimizer)
    if on_gpu:
        allocated, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        source: str | None = "cuda"
    else:
        # One more step under the runtime's CPU meter (its profiler would distort the timed steps).
        meter = MemoryMeter(device, cpu_every=0)
        with meter.measure(1, first_step=0, model=par.module, optimizer=optimizer):
            step()
        allocated = reserved = round(meter.last_gib * GIB) if meter.last_gib is not None else -1
        source = meter.source if meter.last_gib is not None else None
    allocated, reserved, state = _agreed_max([allocated, reserved, state], device)
    return StepMeasurement(
        seconds=agreed_seconds(statistics.median(steps), device),
        update_seconds=agreed_seconds(statistics.median(updates), device),
        peak_allocated_bytes=allocated if allocated >= 0 else None,
        peak_reserved_bytes=reserved if reserved >= 0 else None,
        state_bytes=state,
        memory_source=source,
    )


def _agreed_room(budget: Budget, needed_s: float, device: torch.device) -> bool:
    """Whether every rank's budget still has `needed_s` seconds (ranks must decide together)."""
    left = budget.seconds - (time.perf_counter() - budget.started)
    room = torch.tensor([1.0 if left > 0 and left >= needed_s else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(room, op=dist.ReduceOp.MIN)
    return room.item() > 0


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
    """One sample per shape that fits in the budget and in memory: eager shapes within their part
    of the budget, then compiled ones within the rest. A compiled shape starts only while the
    budget lasts and, after the first, only if what is left covers what the last one took (its
    compilation dominates)."""
    samples: list[dict] = []
    if spec.get("architecture") not in ("llama", "gpt2"):
        return samples
    on_gpu = device.type == "cuda"
    world = dist.get_world_size() if dist.is_initialized() else 1
    compiled_s = budget.seconds * COMPILED_SHARE
    eager = Budget(budget.seconds - compiled_s)
    compiled_budget: Budget | None = None
    last_compiled_s = 0.0
    for shape in SHAPES + COMPILED_SHAPES:
        if shape.compile:
            if compiled_budget is None:  # eager time left over goes to the compiled shapes
                left = eager.seconds - (time.perf_counter() - eager.started)
                compiled_budget = Budget(compiled_s + max(0.0, left))
            if not _agreed_room(compiled_budget, last_compiled_s, device):
                break
        elif agreed_exhausted(eager, device):
            continue
        plan = _plan(
            spec,
            shape=shape,
            micro_batch=micro_batch,
            seq_len=seq_len,
            gpus_per_node=gpus_per_node,
            on_gpu=on_gpu,
        )
        started = time.perf_counter()
        try:
            measured = _time_steps(plan, device, optimizer)
        except torch.OutOfMemoryError:
            # Same model on every rank: all run out together. Skip the shape (a replicated one may
            # not fit where a sharded one does).
            torch.cuda.empty_cache()
            continue
        finally:
            if shape.compile:
                torch._dynamo.reset()  # drop this model's compiled graphs before the next one
        if shape.compile:
            last_compiled_s = agreed_seconds(time.perf_counter() - started, device)
        samples.append(
            {
                "num_layers": shape.layers,
                "micro_batch_size": micro_batch,
                "grad_accum_steps": shape.accum,
                "seq_len": seq_len,
                "ranks": world,
                "sharding": shape.sharding,
                "optimizer": optimizer,
                "dtype": plan.config.param_dtype,
                "compile": shape.compile,
                "checkpointing": shape.checkpointing,
                "loss_chunks": plan.config.loss_chunks,
                "seconds": measured.seconds,
                "update_seconds": measured.update_seconds,
                "peak_allocated_bytes": measured.peak_allocated_bytes,
                "peak_reserved_bytes": measured.peak_reserved_bytes,
                "state_bytes": measured.state_bytes,
                "memory_source": measured.memory_source,
            }
        )
        on_sample(shape.describe())
    if dist.is_initialized():
        dist.barrier()
    return samples
