"""The trainer a launch bundle runs: `python -m executor.runtime.train --plan plan.json [options]`.

Reads the plan, checks the job matches it, builds the model, applies the planned strategy
(`parallelize`), then trains on a prepared dataset (`--data DIR`, see `executor.runtime.data`) or,
for a rehearsal, synthetic tokens (`--synthetic-data`, never a default), with AdamW/SGD, warmup +
cosine, gradient clipping and accumulation, held-out evaluation (`--eval-every`), distributed
checkpoints, and per-step metrics (optionally TensorBoard / W&B too).

Precision on CPU: a plan priced for bf16 computes in float32 on CPU by default (`--precision
auto`): bf16 matmuls on CPUs without AMX are several times slower than fp32 and the CPU run is a
functional rehearsal, not a performance one. `--precision plan` keeps the plan's dtypes anyway.

Out of memory: any rank whose allocation fails (CUDA or CPU) appends one `{"event": "oom", ...}`
line to the metrics file, prints one line to stderr and exits with EXIT_OOM (3), see
`executor.runtime.oom`.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from contract.plan_document import PlanError, RuntimePlan, load_plan
from executor.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from executor.runtime.data import BatchIndex, DataError, SyntheticTokens, TokenSource, open_dataset
from executor.runtime.distributed import (
    DistEnv,
    LaunchError,
    build_mesh,
    data_parallel_rank,
    exit_process,
    init_distributed,
)
from executor.runtime.evaluate import evaluate
from executor.runtime.float8 import Float8Error
from executor.runtime.loggers import Tracker, open_trackers
from executor.runtime.materialize import materialize
from executor.runtime.metrics import MemoryMeter, MetricsWriter, StepMetrics, mfu
from executor.runtime.models import ModelFactoryError, build_model, count_params
from executor.runtime.oom import EXIT_OOM, PhaseTracker, find_oom, limit_cuda_memory, oom_record, report_oom
from executor.runtime.optim import OptimizerSettings, build_optimizer, lr_factor, set_lr
from executor.runtime.options import RunOptions, add_options, parse_options
from executor.runtime.parallelize import Overrides, Parallelized, parallelize
from executor.runtime.pretrained import load_pretrained
from executor.runtime.safetensors_io import WeightsError
from executor.runtime.step import train_step

USER_ERRORS = (PlanError, LaunchError, DataError, ModelFactoryError, WeightsError, Float8Error)
"""Errors caused by inputs a person can fix: reported as one line, without a traceback."""

EPILOG = f"""exit status: 0 done; 1 unexpected failure (traceback above); 2 invalid input (plan, launch,
data, model factory: one line says what to fix); {EXIT_OOM} out of memory: the failing rank appends
{{"event": "oom", "step", "phase", "requested_bytes", "allocated_bytes", "reserved_bytes", ...}} to
--metrics-file and prints one line to stderr."""


def parse_args(argv: list[str] | None = None) -> RunOptions:
    """The command line: one flag per `RunOptions` field (`executor.runtime.options`)."""
    parser = argparse.ArgumentParser(
        prog="python -m executor.runtime.train",
        description="Train with a fsdp-planner plan (compiled SimpleFSDP or eager FSDP2).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parse_options(add_options(parser), argv)


@dataclass(slots=True)
class StopFlag:
    """Set by SIGTERM/SIGUSR1 (preemption): every rank stops after the same step and saves."""

    requested: bool = False

    def install(self) -> None:
        def handler(signum: int, frame: object) -> None:
            self.requested = True

        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, handler)


def log0(env: DistEnv, message: str) -> None:
    if env.rank == 0:
        print(message, flush=True)


def resolve_overrides(plan: RuntimePlan, args: RunOptions, env: DistEnv) -> tuple[Overrides, str | None]:
    note = None
    dtype = None
    wants_bf16 = "bfloat16" in (plan.config.param_dtype, plan.config.reduce_dtype)
    if args.precision == "fp32" or (args.precision == "auto" and env.device.type == "cpu" and wants_bf16):
        dtype = torch.float32
        if wants_bf16:
            note = "precision: float32 instead of the plan's bfloat16" + (
                " (CPU run; --precision plan keeps bf16)" if args.precision == "auto" else ""
            )
    overrides = Overrides(
        engine=None if args.engine == "auto" else args.engine,
        compile=False if args.no_compile else None,
        backend=args.compile_backend,
        param_dtype=dtype,
        reduce_dtype=dtype,
    )
    return overrides, note


NO_DATA = (
    "no training data: pass --data DIR, a dataset made by `fsdp-planner prepare-data` (with launch.sh: "
    "DATA=DIR ./launch.sh), or --synthetic-data (launch.sh: SYNTHETIC_DATA=1) for a rehearsal on "
    "synthetic tokens"
)
SYNTHETIC_WARNING = (
    "WARNING: training on SYNTHETIC tokens (--synthetic-data). This rehearses the plan's speed and "
    "memory; the model learns nothing useful. Pass --data DIR (fsdp-planner prepare-data) to train."
)


def check_data_args(args: RunOptions) -> None:
    """Synthetic tokens only when asked for by name: a real job must never train on them by accident."""
    if args.data and args.synthetic_data:
        raise DataError("--data and --synthetic-data exclude each other: pick one")
    if not args.data and not args.synthetic_data:
        raise DataError(NO_DATA)
    if args.synthetic_data and args.data_dtype:
        raise DataError("--data-dtype describes a --data file; --synthetic-data reads none")


def build_data(args: RunOptions, plan: RuntimePlan) -> TokenSource:
    vocab, seq_len = plan.model.vocab_size, plan.training.seq_len
    if args.synthetic_data:
        return SyntheticTokens(vocab_size=vocab, seq_len=seq_len, seed=args.seed)
    assert args.data is not None  # check_data_args: --data or --synthetic-data
    return open_dataset(
        args.data,
        dtype=args.data_dtype,
        vocab_size=vocab,
        seq_len=seq_len,
        seed=args.seed,
        sequences_per_step=plan.training.sequences,
    )


@dataclass(slots=True)
class Run:
    """What the phases share: the options and plan, this rank's place, and what set-up built."""

    opts: RunOptions
    tracker: PhaseTracker
    plan: RuntimePlan
    env: DistEnv
    dp_rank: int
    """Data-parallel coordinates: the ranks of a tensor-parallel group read the same sequences."""
    dp_size: int
    par: Parallelized
    settings: OptimizerSettings
    optimizer: torch.optim.Optimizer
    data: TokenSource
    start_step: int = 0
    """The step already done when the loop starts (0, or the resumed checkpoint's)."""

    @property
    def tokens_per_step(self) -> int:
        return self.plan.training.sequences * self.plan.training.seq_len

    @property
    def loss_ranks(self) -> int:
        """The ranks whose losses the logged mean is over: every rank, or with pp > 1 the ranks
        of the last stage (the others hold zero)."""
        return self.env.world_size // self.plan.config.mesh.pp


def train(args: RunOptions, tracker: PhaseTracker | None = None) -> int:
    """Set up, restore, loop, stop. (Process-group teardown: `main`, which knows whether a rank ran
    out of memory.)"""
    run = set_up(args, tracker or PhaseTracker())
    run.start_step = restore(run)
    if run.start_step >= args.steps:
        log0(run.env, f"nothing to do: already at step {run.start_step} of {args.steps}")
        return 0
    history = loop(run)
    finish(run, history)
    return 0


# ---- set up: process group and mesh, model (AC, compile, FSDP: `parallelize`), optimizer, data ----


def set_up(args: RunOptions, tracker: PhaseTracker) -> Run:
    check_data_args(args)
    plan, env, mesh = _start(args, tracker)
    dp_rank, dp_size = data_parallel_rank(mesh)
    log0(
        env,
        f"plan {plan.model.name} {plan.plan_hash[:12]} | {env.world_size} rank(s) on {env.device.type} "
        f"({env.backend}), mesh {plan.config.mesh.label()} | torch {torch.__version__} | runtime "
        f"{Path(__file__).parent}",
    )
    par = _build_model(args, plan, env, mesh, dp_size)
    settings = OptimizerSettings(
        name=plan.training.optimizer,
        lr=args.lr,
        min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup or 0,  # parse_args fills it in
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
    )
    optimizer = build_optimizer(par.module, settings, device=env.device)
    tracker.enter("data")
    data = _open_data(args, plan, env)
    log0(
        env,
        f"  optimizer {settings.name} lr {settings.lr:g} warmup {settings.warmup_steps} cosine to "
        f"{settings.min_lr_ratio:g}x over {args.steps} steps"
        + (f"; eval every {args.eval_every} steps on {args.eval_batches} batches" if args.eval_every else ""),
    )
    return Run(args, tracker, plan, env, dp_rank, dp_size, par, settings, optimizer, data)


def _start(args: RunOptions, tracker: PhaseTracker) -> tuple[RuntimePlan, DistEnv, DeviceMesh]:
    """The plan, the process group (and the CUDA memory cap, if asked for) and the device mesh."""
    plan = load_plan(args.plan)
    tracker.plan_hash = plan.plan_hash
    env = init_distributed(plan, device=args.device)
    tracker.rank, tracker.device = env.rank, env.device
    if args.max_memory_gib is not None:
        if env.device.type != "cuda":
            raise LaunchError("--max-memory-gib caps CUDA memory; this run is on CPU (leave the option out)")
        try:
            tracker.memory_limit_bytes = limit_cuda_memory(env.device, args.max_memory_gib)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
    return plan, env, build_mesh(plan, env)


def _build_model(
    args: RunOptions, plan: RuntimePlan, env: DistEnv, mesh: DeviceMesh, dp_size: int
) -> Parallelized:
    """The model, parallelized as planned, with its first weights (initialized, or --init-from)."""
    cfg, training = plan.config, plan.training
    torch.manual_seed(args.seed)
    overrides, precision_note = resolve_overrides(plan, args, env)
    model = build_model(plan.model, seq_len=training.seq_len, factory=args.model_factory)
    on_meta = any(p.is_meta for p in model.parameters())
    if not on_meta:
        model.to(env.device)
    n_params = count_params(model)
    if plan.model.num_params and not args.model_factory and n_params != plan.model.num_params:
        log0(env, f"warning: model has {n_params:,} parameters, the plan priced {plan.model.num_params:,}")
    par = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    init_from = args.init_from
    if init_from and args.resume and latest_checkpoint(args.checkpoint_dir) is not None:
        log0(env, f"  weights: --init-from {init_from} not loaded: resuming from {args.checkpoint_dir} wins")
        init_from = None
    if on_meta:
        materialize(par.module, device=env.device, seed=args.seed, init=init_from is None)
    if init_from:
        loaded = load_pretrained(
            par.module, init_from, cfg=plan.model, seq_len=training.seq_len, share=par.pipeline is not None
        )
        log0(env, "  " + loaded.describe())
    for line in ([precision_note] if precision_note else []) + par.notes:
        log0(env, "  " + line)
    log0(
        env,
        f"  model: {n_params / 1e6:.1f}M parameters, {plan.model.num_layers} blocks; "
        f"micro-batch {cfg.micro_batch_size} x {cfg.grad_accum_steps} "
        f"{'pipeline micro-batches' if par.pipeline is not None else 'accumulation'} x {dp_size} "
        f"data-parallel ranks = {training.sequences} sequences of {training.seq_len} tokens per step",
    )
    return par


def _open_data(args: RunOptions, plan: RuntimePlan, env: DistEnv) -> TokenSource:
    data = build_data(args, plan)
    if args.eval_every and not data.has_eval:
        raise DataError(
            f"--eval-every: {data.description} has no eval split; prepare it with "
            "`fsdp-planner prepare-data --eval-fraction 0.01` (or leave --eval-every out)"
        )
    if data.synthetic:
        log0(env, "!" * 100 + "\n" + SYNTHETIC_WARNING + "\n" + "!" * 100)
    log0(env, f"  data: {data.description}")
    epoch = getattr(data, "steps_per_epoch", None)
    if epoch is not None:
        log0(env, f"  data: one epoch is {epoch:,.1f} steps of {plan.training.sequences} sequences")
    return data


# ---- restore: the newest checkpoint, when --resume ----


def restore(run: Run) -> int:
    """The step to continue after: the resumed checkpoint's, or 0."""
    args, env = run.opts, run.env
    if not args.resume:
        return 0
    run.tracker.enter("resume")
    found = latest_checkpoint(args.checkpoint_dir)
    if found is None:
        log0(env, f"  resume: no checkpoint in {args.checkpoint_dir}, starting from step 0")
        return 0
    state = load_checkpoint(found, model=run.par.module, optimizer=run.optimizer)
    start_step = int(state["step"])
    _warn_on_mismatch(run, state)
    log0(env, f"  resumed from {found} (step {start_step})")
    return start_step


def _warn_on_mismatch(run: Run, state: dict) -> None:
    """One warning for each way the checkpoint's run differs from this one."""
    env, seed, sequences, data = run.env, run.opts.seed, run.plan.training.sequences, run.data.description
    if state.get("plan_hash") != run.plan.plan_hash:
        log0(env, "  warning: the checkpoint was written under another plan")
    if state.get("seed") != seed:
        log0(env, f"  warning: checkpoint data seed {state.get('seed')} differs from --seed {seed}")
    if state.get("data", data) != data:
        log0(env, f"  warning: the checkpoint trained on {state.get('data')}, this run reads {data}")
    if state.get("sequences_per_step", sequences) != sequences:
        log0(env, f"  warning: the checkpoint took {state.get('sequences_per_step')} sequences per "
             f"step, this plan {sequences}: the data position is the step, so sequences "
             "are skipped or repeated")


# ---- loop: steps (accumulation inside `train_step`), metrics, eval, checkpoints, stop requests ----


def loop(run: Run) -> list[StepMetrics]:
    """Steps start_step+1 .. --steps (or until a stop request); each step's metrics, in order."""
    args, env = run.opts, run.env
    stop = StopFlag()
    stop.install()
    meter = MemoryMeter(env.device, cpu_every=args.memory_every)
    writer = MetricsWriter(args.metrics_file, enabled=env.rank == 0, total_steps=args.steps)
    trackers = _open_trackers(run)
    history: list[StepMetrics] = []
    try:
        for step in range(run.start_step + 1, args.steps + 1):
            record, stopping = _step(run, step, meter, stop)
            if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                _evaluate(run, record)
            history.append(record)
            writer.log(record)
            for t in trackers:
                t.log(_scalars(record), step)
            due = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
            if args.checkpoint_dir and (due or step == args.steps or stopping):
                _save(run, step)
            if stopping:
                log0(env, f"stop requested (SIGTERM/SIGUSR1): stopped after step {step}")
                break
    finally:
        writer.close()
        for t in trackers:
            t.close()
    return history


def _open_trackers(run: Run) -> list[Tracker]:
    """TensorBoard / W&B, when asked for: rank 0 only."""
    if run.env.rank != 0:
        return []
    plan, training, args = run.plan, run.plan.training, run.opts
    return open_trackers(
        tensorboard=args.tensorboard,
        wandb_project=args.wandb_project,
        run_name=f"{plan.model.name}-{plan.plan_hash[:12]}",
        config={"plan_hash": plan.plan_hash, "model": plan.model.name, "world_size": run.env.world_size,
                "mesh": plan.config.mesh.as_document(),
                "seq_len": training.seq_len, "sequences_per_step": training.sequences,
                "lr": run.settings.lr, "steps": args.steps, "data": run.data.description},
    )


def _step(run: Run, step: int, meter: MemoryMeter, stop: StopFlag) -> tuple[StepMetrics, bool]:
    """One optimizer step over every micro-batch; its metrics, and whether any rank was asked to stop."""
    env, cfg, settings, tracker = run.env, run.plan.config, run.settings, run.tracker
    lr = settings.lr * lr_factor(
        step, total_steps=run.opts.steps, warmup_steps=settings.warmup_steps, min_ratio=settings.min_lr_ratio
    )
    set_lr(run.optimizer, lr)
    tracker.enter("data", step)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with meter.measure(step, first_step=run.start_step + 1, model=run.par.module, optimizer=run.optimizer):
        batches = (
            run.data.batch(BatchIndex(step, micro, run.dp_rank, run.dp_size, cfg.micro_batch_size)).to(
                env.device, non_blocking=True
            )
            for micro in range(cfg.grad_accum_steps)
        )
        result = train_step(
            run.par,
            run.optimizer,
            batches,
            grad_accum_steps=cfg.grad_accum_steps,
            max_grad_norm=settings.max_grad_norm,
            loss_chunks=cfg.loss_chunks,
            phase=tracker,
        )
    tracker.enter("sync")
    # One small all-reduce: the global mean loss, and whether any rank was asked to stop. (The
    # ranks of a cp x tp group hold the same loss, context parallelism's being its group's mean:
    # the mean over all ranks is still the mean over the data-parallel ranks; under a pipeline
    # only the last stage's ranks hold one, `loss_ranks`.)
    stats = torch.stack(
        [result.loss_sum / cfg.grad_accum_steps, torch.tensor(float(stop.requested), device=env.device)]
    )
    dist.all_reduce(stats)
    elapsed = time.perf_counter() - t0
    # Per GPU: the step's tokens over every rank, cp and tp included (a cp x tp group shares its
    # tokens and splits their FLOPs), as the planner prices tokens/s/GPU and MFU.
    tps = run.tokens_per_step / env.world_size / elapsed
    peak_tflops = run.plan.cluster.gpu_spec.peak_bf16_tflops
    record = StepMetrics(
        step=step,
        loss=stats[0].item() / run.loss_ranks,
        grad_norm=result.grad_norm,
        lr=lr,
        step_time_s=elapsed,
        tokens_per_s_per_gpu=tps,
        mfu=mfu(tps, flops_per_token=run.plan.model.flops_per_token, peak_tflops=peak_tflops),
        peak_memory_gib=meter.last_gib,
        memory_source=meter.source,
        tokens_seen=step * run.tokens_per_step,
        peak_allocated_gib=meter.last_allocated_gib,
        synthetic_data=run.data.synthetic,
    )
    return record, stats[1].item() > 0


def _evaluate(run: Run, record: StepMetrics) -> None:
    """The held-out loss (and the time it took) into `record`."""
    cfg = run.plan.config
    run.tracker.enter("eval", record.step)
    started = time.perf_counter()
    record.eval_loss = evaluate(
        run.par,
        run.data,
        batches=run.opts.eval_batches,
        dp_rank=run.dp_rank,
        dp_size=run.dp_size,
        micro_batch_size=cfg.micro_batch_size,
        grad_accum_steps=cfg.grad_accum_steps,
        loss_chunks=cfg.loss_chunks,
        device=run.env.device,
    )
    record.eval_time_s = time.perf_counter() - started


def _save(run: Run, step: int) -> None:
    """A distributed checkpoint of step `step` (the last one, a --checkpoint-every one, or at a stop)."""
    args = run.opts
    assert args.checkpoint_dir is not None
    run.tracker.enter("checkpoint")
    path = save_checkpoint(
        args.checkpoint_dir,
        step=step,
        model=run.par.module,
        optimizer=run.optimizer,
        keep=args.keep_checkpoints,
        train_state={
            "plan_hash": run.plan.plan_hash,
            "seed": args.seed,
            "data": run.data.description,
            "sequences_per_step": run.plan.training.sequences,
            "world_size": run.env.world_size,
            "tokens_seen": step * run.tokens_per_step,
        },
    )
    log0(run.env, f"  checkpoint saved: {path}")


# ---- stop: the closing summary (the last checkpoint is the loop's; teardown: `main`) ----


def finish(run: Run, history: list[StepMetrics]) -> None:
    _summary(run.env, run.plan, history, timing_warmup=run.opts.timing_warmup)


def _scalars(m: StepMetrics) -> dict[str, float]:
    values = {
        "train/loss": m.loss,
        "train/grad_norm": m.grad_norm,
        "train/lr": m.lr,
        "perf/step_time_s": m.step_time_s,
        "perf/tokens_per_s_per_gpu": m.tokens_per_s_per_gpu,
        "train/tokens_seen": float(m.tokens_seen),
    }
    if m.mfu is not None:
        values["perf/mfu"] = m.mfu
    if m.peak_memory_gib is not None:
        values["perf/peak_memory_gib"] = m.peak_memory_gib
    if m.eval_loss is not None:
        values["eval/loss"] = m.eval_loss
    return values


def _summary(env: DistEnv, plan: RuntimePlan, history: list[StepMetrics], *, timing_warmup: int) -> None:
    if env.rank != 0 or not history:
        return
    # The statistic `fsdp-planner validate` prints and stores: the median over the steps after the
    # warm-up ones, so a run never reports two step times (the mean let one slow step pull it).
    warm = timing_warmup if 0 <= timing_warmup < len(history) else 0
    steady = history[warm:]
    step_time = statistics.median(m.step_time_s for m in steady)
    tps = statistics.median(m.tokens_per_s_per_gpu for m in steady)
    peak = max((m.peak_memory_gib for m in history if m.peak_memory_gib is not None), default=None)
    pred = plan.prediction
    line = (
        f"done: {len(history)} steps, loss {history[0].loss:.4f} -> {history[-1].loss:.4f}; "
        f"median step time {step_time:.4g} s over steps {steady[0].step}-{steady[-1].step} "
        f"(after {warm} warm-up), {tps:,.0f} tok/s/gpu"
    )
    if peak is not None:
        line += f", peak memory {peak:.2f} GiB"
    print(line, flush=True)
    if pred.step_time_s and pred.tokens_per_s_per_gpu:
        print(
            f"  plan predicted (on {plan.cluster.gpu}): step {pred.step_time_s:.3f} s, "
            f"{pred.tokens_per_s_per_gpu:,.0f} tok/s/gpu, peak {pred.peak_memory_gib or 0:.2f} GiB",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    # A rank killed by a signal (a segfault or an abort in a collective library, an allocator's heap
    # check) prints every Python thread's stack to stderr, so its last step names where it died; the
    # launcher's per-rank prefix tells which rank it was.
    faulthandler.enable(all_threads=True)
    args = parse_args(argv)
    tracker = PhaseTracker()
    oom = False
    try:
        return train(args, tracker)
    except USER_ERRORS as exc:
        # Every rank fails the same way; one message is enough.
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:  # an allocation failure may arrive wrapped (compile, checkpointing)
        failure = find_oom(exc)
        if failure is None:
            raise
        oom = True
        report_oom(oom_record(failure, tracker), args.metrics_file)
        return EXIT_OOM
    finally:
        teardown(oom=oom)


def teardown(*, oom: bool) -> None:
    """The process group's end, unless this rank ran out of memory: the other ranks may be inside a
    collective it will never join, so tearing the group down could wait on them. The caller exits
    without teardown anyway."""
    if dist.is_initialized() and not oom:
        dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
