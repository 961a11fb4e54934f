"""torchrun worker: measure the memory of planned configurations with torch's own accounting.

    torchrun --nproc-per-node 2 tests/executor/workers/memory_fidelity.py --plans plans.json --out out.json

`plans.json` is a list of `{"label": ..., "plan": <Plan document>}` (made by the planner itself, see
tests/executor/test_memory_fidelity.py). Each plan runs through the runtime's own code path
(`parallelize`, `materialize`, the trainer's optimizer, `train_step`) on CPU in fp32, in one process
group, for `--steps` optimizer steps:

  step 1        warm-up: lazy initialisation, compilation, optimizer state created
  step 2..N     the whole-step peak by the runtime's CPU method (`MemoryMeter`: persistent bytes at
                the step's start + the torch profiler's peak net allocation during the step), read
                twice from one profile: all threads (the runtime's number) and the training thread
                alone (without gloo's worker-thread temporaries, which a GPU does not have)
  last step     eager FSDP2 plans only: again under torch's `FSDPMemTracker`, whose peak snapshot
                splits the same peak by category (params, gradients, optimizer, activations, ...)

Exact state sizes are read from the tensors: local parameter, gradient (at the end of backward,
before the update frees them) and optimizer-state bytes. Every rank reports; rank 0 writes one
record per plan with the per-rank values.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import RuntimePlan, parse_plan  # noqa: E402
from executor.runtime.data import BatchIndex, SyntheticTokens  # noqa: E402
from executor.runtime.distributed import (  # noqa: E402
    build_mesh,
    data_parallel_rank,
    exit_process,
    init_distributed,
)
from executor.runtime.materialize import materialize  # noqa: E402
from executor.runtime.metrics import (  # noqa: E402
    GIB,
    _quiet_stdout,
    all_threads_peak,
    persistent_bytes,
    training_thread_peak,
)
from executor.runtime.models import build_model, count_params  # noqa: E402
from executor.runtime.optim import OptimizerSettings, build_optimizer  # noqa: E402
from executor.runtime.parallelize import Overrides, parallelize  # noqa: E402
from executor.runtime.step import train_step  # noqa: E402
from tests.executor.workers.collector import full_collections_skipped  # noqa: E402

SEED = 0


def local_bytes(tensors: list[torch.Tensor]) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Moment buffers only (AdamW's scalar `step` counters are not priced, and are a few bytes)."""
    states = [v for state in optimizer.state.values() for v in state.values()]
    return local_bytes([v for v in states if isinstance(v, torch.Tensor) and v.ndim])


def measured_step(module: nn.Module, optimizer: torch.optim.Optimizer, step: Any) -> dict[str, float]:
    """One step under the torch profiler, as the runtime's MemoryMeter measures a CPU step
    (persistent bytes at the step's start + peak net allocation), read for all threads (exactly
    the runtime's number) and for the training thread alone."""
    base = persistent_bytes(module, optimizer)
    with _quiet_stdout():  # kineto prints start/stop banners from C++
        prof_cm = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        prof = prof_cm.__enter__()
    try:
        step()
    finally:
        with _quiet_stdout():
            prof_cm.__exit__(None, None, None)
    all_threads = all_threads_peak(prof)
    assert all_threads is not None, "the profiler's memory events are unreadable in this torch"
    return {
        "all_threads": (base + all_threads) / GIB,
        "training_thread": (base + training_thread_peak(prof)) / GIB,
    }


def mem_tracker_peak(
    module: nn.Module, optimizer: torch.optim.Optimizer, step: Any
) -> tuple[dict[str, int] | None, str | None]:
    """Run `step` under torch's FSDPMemTracker; the peak snapshot by category (bytes), or why not."""
    try:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(module, optimizer)
        with tracker:
            step()
        snapshot = tracker.get_tracker_snapshot("peak")
    except Exception as exc:  # a private tool: report, do not fail the measurement
        return None, f"{type(exc).__name__}: {exc}"[:300]
    cpu = {str(dev): snap for dev, snap in snapshot.items() if torch.device(dev).type == "cpu"}
    if not cpu:
        return None, f"no cpu entry in the snapshot: {list(snapshot)}"
    # Keys are torch's category names ("Sharded Param", "Activation", "Temp", ..., "Total").
    return {getattr(k, "value", str(k)): int(v) for k, v in next(iter(cpu.values())).items()}, None


def run_plan(label: str, plan: RuntimePlan, *, steps: int, meshes: dict[tuple, DeviceMesh]) -> dict[str, Any]:
    env = init_distributed(plan)
    cfg = plan.config
    key = (cfg.sharding, cfg.mesh.dp_replicate, cfg.mesh.dp_shard, cfg.mesh.tp)
    if key not in meshes:  # one set of process groups per mesh shape, reused across plans
        meshes[key] = build_mesh(plan, env)
    mesh = meshes[key]
    dp_rank, dp_size = data_parallel_rank(mesh)  # a tp group reads the same sequences

    model = build_model(plan.model, seq_len=plan.training.seq_len)
    n_params = count_params(model)
    # The plan's own dtypes: fp32 cases, and bf16 ones where RMSNorm keeps fp32 copies of its input.
    par = parallelize(model, plan=plan, mesh=mesh, overrides=Overrides())
    materialize(par.module, device=env.device, seed=SEED)
    optimizer = build_optimizer(
        par.module, OptimizerSettings(name=plan.training.optimizer, warmup_steps=1), device=env.device
    )
    data = SyntheticTokens(vocab_size=plan.model.vocab_size, seq_len=plan.training.seq_len, seed=SEED)
    grad_bytes: list[int] = []

    def capture_grads() -> None:
        grads = [p.grad for p in par.module.parameters() if p.grad is not None]
        grad_bytes.append(local_bytes(grads))

    def one_step(step: int) -> None:
        batches = [
            data.batch(BatchIndex(step, micro, dp_rank, dp_size, cfg.micro_batch_size))
            for micro in range(cfg.grad_accum_steps)
        ]
        train_step(
            par,
            optimizer,
            iter(batches),
            grad_accum_steps=cfg.grad_accum_steps,
            max_grad_norm=1.0,
            loss_chunks=cfg.loss_chunks,
            before_update=capture_grads,
        )

    peaks: list[dict[str, float]] = []
    times: list[float] = []
    tracker: dict[str, int] | None = None
    tracker_error: str | None = None
    use_tracker = par.engine == "fsdp2" and not par.compiled
    for step in range(1, steps + 1):
        gc.collect()
        t0 = time.perf_counter()
        if step == 1:
            # Unmeasured; compiling it made ~14 full collections per rank (~3 s), and the
            # gc.collect() above the next step frees what they would have.
            with full_collections_skipped():
                one_step(step)
        elif step == steps and use_tracker:
            tracker, tracker_error = mem_tracker_peak(par.module, optimizer, lambda s=step: one_step(s))
        else:
            peaks.append(measured_step(par.module, optimizer, lambda s=step: one_step(s)))
        times.append(time.perf_counter() - t0)

    params = local_bytes(list(par.module.parameters()))
    record = {
        "label": label,
        "rank": env.rank,
        "engine": par.engine,
        "compiled": par.compiled,
        "num_params": n_params,
        "param_bytes": params,
        "grad_bytes": max(grad_bytes),
        "optimizer_bytes": optimizer_bytes(optimizer),
        "persistent_bytes": persistent_bytes(par.module, optimizer),
        "peaks_gib": [p["training_thread"] for p in peaks],
        "runtime_meter_peak_gib": max(p["all_threads"] for p in peaks),
        "runtime_meter_peaks_gib": [p["all_threads"] for p in peaks],
        "mem_tracker": tracker,
        "mem_tracker_error": tracker_error,
        "step_s": times,
        "notes": par.notes,
    }
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    # 6 measured steps per eager plan (a warm-up and the tracker's step besides): the lowest counts, and
    # with 3 the accumulating plans' peaks kept a gloo buffer in flight in every one now and then. Those
    # plans (a micro-batch's collectives still queued on gloo's one worker thread when the next
    # micro-batch peaks) measure 12: with 6, a loaded CI run found every step of one of them ~15% over
    # its clean peak once in three runs (2026-11-29).
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per eager plan")
    parser.add_argument("--accumulating-steps", type=int, default=14,
                        help="optimizer steps per eager plan of several micro-batches")
    parser.add_argument("--compiled-steps", type=int, default=4, help="optimizer steps per compiled plan")
    args = parser.parse_args()
    cases = json.loads(args.plans.read_text())
    meshes: dict[tuple, DeviceMesh] = {}
    results: list[list[dict[str, Any]]] = []
    # Everything alive now (torch, dynamo, sympy: ~500k objects) lives as long as the process, so
    # it is moved out of the collector's sight: each gc.collect() below then walks only what the
    # plans allocate (the garbage it is there to free), not ~0.17 s of imports, ~100 times per
    # launch (after a compiled plan, its own long-lived objects still take a while).
    gc.freeze()
    for case in cases:
        plan = parse_plan(case["plan"])
        if plan.config.compile:
            steps = args.compiled_steps
        else:
            steps = args.accumulating_steps if plan.config.grad_accum_steps > 1 else args.steps
        record = run_plan(case["label"], plan, steps=steps, meshes=meshes)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, record)
        results.append(gathered)
        gc.collect()  # the last plan's model and optimizer, before the next plan is built
        if dist.get_rank() == 0:
            summary = {k: record[k] for k in ("label", "peaks_gib", "step_s", "mem_tracker_error")}
            print(json.dumps(summary), flush=True)
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()
    exit_process(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
