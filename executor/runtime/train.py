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
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

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
from executor.runtime.loggers import Tracker, open_trackers
from executor.runtime.materialize import materialize
from executor.runtime.metrics import MemoryMeter, MetricsWriter, StepMetrics, mfu
from executor.runtime.models import ModelFactoryError, build_model, count_params
from executor.runtime.oom import EXIT_OOM, PhaseTracker, find_oom, limit_cuda_memory, oom_record, report_oom
from executor.runtime.optim import OptimizerSettings, build_optimizer, lr_factor, set_lr
from executor.runtime.parallelize import Overrides, Parallelized, parallelize
from executor.runtime.plan import PlanError, RuntimePlan, load_plan
from executor.runtime.pretrained import load_pretrained
from executor.runtime.safetensors_io import WeightsError
from executor.runtime.step import train_step

USER_ERRORS = (PlanError, LaunchError, DataError, ModelFactoryError, WeightsError)
"""Errors caused by inputs a person can fix: reported as one line, without a traceback."""

EPILOG = f"""exit status: 0 done; 1 unexpected failure (traceback above); 2 invalid input (plan, launch,
data, model factory: one line says what to fix); {EXIT_OOM} out of memory: the failing rank appends
{{"event": "oom", "step", "phase", "requested_bytes", "allocated_bytes", "reserved_bytes", ...}} to
--metrics-file and prints one line to stderr."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m executor.runtime.train",
        description="Train with a fsdp-planner plan (compiled SimpleFSDP or eager FSDP2).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--plan", required=True, help="plan JSON (as downloaded with the launcher)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps to run in total (default 20)")
    p.add_argument(
        "--data",
        metavar="PATH",
        help="training data: a dataset directory written by `fsdp-planner prepare-data` (index.json + "
        "token shards), or a flat binary token file. Required unless --synthetic-data",
    )
    p.add_argument(
        "--data-dtype",
        choices=["uint16", "uint32"],
        help="token id type of a flat --data file (default uint16; a dataset directory states its own)",
    )
    p.add_argument(
        "--synthetic-data",
        action="store_true",
        help="train on synthetic tokens instead of --data: a rehearsal of speed and memory, not training",
    )
    p.add_argument(
        "--eval-every", type=int, default=0, metavar="N",
        help="every N steps (and at the last) log the mean loss on the held-out eval split (0: never)",
    )
    p.add_argument(
        "--eval-batches", type=int, default=10, metavar="K",
        help="global batches of eval sequences per evaluation (default 10; the same sequences each time)",
    )
    p.add_argument("--tensorboard", type=Path, metavar="DIR", help="also log scalars to TensorBoard here")
    p.add_argument("--wandb-project", metavar="NAME", help="also log to this Weights & Biases project")
    p.add_argument("--checkpoint-dir", type=Path, help="where distributed checkpoints go")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every N steps (0: only at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=2, help="complete checkpoints to keep (0: all)")
    p.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir"
    )
    p.add_argument(
        "--metrics-file", type=Path, help="append per-step JSON lines here (rank 0; OOM records: every rank)"
    )
    p.add_argument("--seed", type=int, default=0, help="initial weights and data sampling")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of --lr")
    p.add_argument("--warmup", type=int, help="linear warmup steps (default: 10%% of --steps, at most 100)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (0: off)")
    p.add_argument("--model-factory", help="package.module:function returning your nn.Module")
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="DIR",
        help="start from a Hugging Face checkpoint: config.json + model.safetensors (or shards with "
        "model.safetensors.index.json) of the plan's model; a checkpoint found by --resume wins",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "plan", "fp32"],
        help="auto: the plan's dtypes on GPU, float32 on CPU; plan: always the plan's; fp32: always float32",
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "simple_fsdp", "fsdp2"],
        help="auto: SimpleFSDP+compile when the plan compiles, else FSDP2",
    )
    p.add_argument("--no-compile", action="store_true", help="run SimpleFSDP eagerly (debugging)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--memory-every", type=int, default=25, help="CPU only: profile memory every N steps")
    p.add_argument(
        "--timing-warmup",
        type=int,
        default=1,
        help="leading steps left out of the closing summary's median step time (compilation, allocator "
        "growth; default 1); `fsdp-planner validate` passes its --warmup so both report one number",
    )
    p.add_argument(
        "--max-memory-gib",
        type=float,
        help="CUDA only: cap each process's GPU memory at this many GiB (rehearse the plan for a smaller "
        "GPU; going over it is an out-of-memory exit)",
    )
    args = p.parse_args(argv)
    if args.max_memory_gib is not None and args.max_memory_gib <= 0:
        p.error("--max-memory-gib must be positive")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.resume and args.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir")
    if args.eval_every < 0 or args.eval_batches < 1:
        p.error("--eval-every must be >= 0 and --eval-batches >= 1")
    if args.warmup is None:
        args.warmup = min(100, max(1, args.steps // 10))
    return args


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


def resolve_overrides(
    plan: RuntimePlan, args: argparse.Namespace, env: DistEnv
) -> tuple[Overrides, str | None]:
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


def check_data_args(args: argparse.Namespace) -> None:
    """Synthetic tokens only when asked for by name: a real job must never train on them by accident."""
    if args.data and args.synthetic_data:
        raise DataError("--data and --synthetic-data exclude each other: pick one")
    if not args.data and not args.synthetic_data:
        raise DataError(NO_DATA)
    if args.synthetic_data and args.data_dtype:
        raise DataError("--data-dtype describes a --data file; --synthetic-data reads none")


def build_data(args: argparse.Namespace, plan: RuntimePlan) -> TokenSource:
    vocab, seq_len = plan.model.vocab_size, plan.training.seq_len
    if args.synthetic_data:
        return SyntheticTokens(vocab_size=vocab, seq_len=seq_len, seed=args.seed)
    return open_dataset(
        args.data,
        dtype=args.data_dtype,
        vocab_size=vocab,
        seq_len=seq_len,
        seed=args.seed,
        sequences_per_step=plan.training.sequences,
    )


def train(args: argparse.Namespace, tracker: PhaseTracker | None = None) -> int:
    tracker = tracker or PhaseTracker()
    check_data_args(args)
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
    mesh = build_mesh(plan, env)
    cfg, training = plan.config, plan.training
    # Data-parallel coordinates: the ranks of a tensor-parallel group read the same sequences.
    dp_rank, dp_size = data_parallel_rank(mesh)
    log0(
        env,
        f"plan {plan.model.name} {plan.plan_hash[:12]} | {env.world_size} rank(s) on {env.device.type} "
        f"({env.backend}) | torch {torch.__version__} | runtime {Path(__file__).parent}",
    )

    torch.manual_seed(args.seed)
    overrides, precision_note = resolve_overrides(plan, args, env)
    model = build_model(plan.model, seq_len=training.seq_len, factory=args.model_factory)
    on_meta = any(p.is_meta for p in model.parameters())
    if not on_meta:
        model.to(env.device)
    n_params = count_params(model)
    if plan.model.num_params and not args.model_factory and n_params != plan.model.num_params:
        log0(env, f"warning: model has {n_params:,} parameters, the plan priced {plan.model.num_params:,}")
    par: Parallelized = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    init_from = args.init_from
    if init_from and args.resume and latest_checkpoint(args.checkpoint_dir) is not None:
        log0(env, f"  weights: --init-from {init_from} not loaded: resuming from {args.checkpoint_dir} wins")
        init_from = None
    if on_meta:
        materialize(par.module, device=env.device, seed=args.seed, init=init_from is None)
    if init_from:
        loaded = load_pretrained(par.module, init_from, cfg=plan.model, seq_len=training.seq_len)
        log0(env, "  " + loaded.describe())
    for line in ([precision_note] if precision_note else []) + par.notes:
        log0(env, "  " + line)
    log0(
        env,
        f"  model: {n_params / 1e6:.1f}M parameters, {plan.model.num_layers} blocks; "
        f"micro-batch {cfg.micro_batch_size} x {cfg.grad_accum_steps} accumulation x {dp_size} "
        f"data-parallel ranks = {training.sequences} sequences of {training.seq_len} tokens per step",
    )

    settings = OptimizerSettings(
        name=training.optimizer,
        lr=args.lr,
        min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
    )
    optimizer = build_optimizer(par.module, settings, device=env.device)
    tracker.enter("data")
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
        log0(env, f"  data: one epoch is {epoch:,.1f} steps of {training.sequences} sequences")
    log0(
        env,
        f"  optimizer {settings.name} lr {settings.lr:g} warmup {settings.warmup_steps} cosine to "
        f"{settings.min_lr_ratio:g}x over {args.steps} steps"
        + (f"; eval every {args.eval_every} steps on {args.eval_batches} batches" if args.eval_every else ""),
    )

    start_step = 0
    if args.resume:
        tracker.enter("resume")
        found = latest_checkpoint(args.checkpoint_dir)
        if found is None:
            log0(env, f"  resume: no checkpoint in {args.checkpoint_dir}, starting from step 0")
        else:
            state = load_checkpoint(found, model=par.module, optimizer=optimizer)
            start_step = int(state["step"])
            if state.get("plan_hash") != plan.plan_hash:
                log0(env, "  warning: the checkpoint was written under another plan")
            if state.get("seed") != args.seed:
                log0(
                    env,
                    f"  warning: checkpoint data seed {state.get('seed')} differs from --seed {args.seed}",
                )
            if state.get("data", data.description) != data.description:
                log0(env, f"  warning: the checkpoint trained on {state.get('data')}, this run reads "
                     f"{data.description}")
            if state.get("sequences_per_step", training.sequences) != training.sequences:
                log0(env, f"  warning: the checkpoint took {state.get('sequences_per_step')} sequences per "
                     f"step, this plan {training.sequences}: the data position is the step, so sequences "
                     "are skipped or repeated")
            log0(env, f"  resumed from {found} (step {start_step})")
    if start_step >= args.steps:
        log0(env, f"nothing to do: already at step {start_step} of {args.steps}")
        return 0

    stop = StopFlag()
    stop.install()
    meter = MemoryMeter(env.device, cpu_every=args.memory_every)
    writer = MetricsWriter(args.metrics_file, enabled=env.rank == 0, total_steps=args.steps)
    trackers: list[Tracker] = []
    if env.rank == 0:
        trackers = open_trackers(
            tensorboard=args.tensorboard,
            wandb_project=args.wandb_project,
            run_name=f"{plan.model.name}-{plan.plan_hash[:12]}",
            config={"plan_hash": plan.plan_hash, "model": plan.model.name, "world_size": env.world_size,
                    "seq_len": training.seq_len, "sequences_per_step": training.sequences,
                    "lr": settings.lr, "steps": args.steps, "data": data.description},
        )
    tokens_per_step = training.sequences * training.seq_len
    flops_per_token = plan.model.flops_per_token
    history: list[StepMetrics] = []
    step = start_step
    try:
        for step in range(start_step + 1, args.steps + 1):
            lr = settings.lr * lr_factor(
                step,
                total_steps=args.steps,
                warmup_steps=settings.warmup_steps,
                min_ratio=settings.min_lr_ratio,
            )
            set_lr(optimizer, lr)
            tracker.enter("data", step)
            if env.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with meter.measure(step, first_step=start_step + 1, model=par.module, optimizer=optimizer):
                batches = (
                    data.batch(BatchIndex(step, micro, dp_rank, dp_size, cfg.micro_batch_size)).to(
                        env.device, non_blocking=True
                    )
                    for micro in range(cfg.grad_accum_steps)
                )
                result = train_step(
                    par,
                    optimizer,
                    batches,
                    grad_accum_steps=cfg.grad_accum_steps,
                    max_grad_norm=settings.max_grad_norm,
                    loss_chunks=cfg.loss_chunks,
                    phase=tracker,
                )
            tracker.enter("sync")
            # One small all-reduce: the global mean loss, and whether any rank was asked to stop. (The
            # ranks of a tp group hold the same loss: the mean over all ranks is still the mean over
            # the data-parallel ranks.)
            stats = torch.stack(
                [
                    result.loss_sum / cfg.grad_accum_steps,
                    torch.tensor(float(stop.requested), device=env.device),
                ]
            )
            dist.all_reduce(stats)
            elapsed = time.perf_counter() - t0
            # Per GPU: the step's tokens over every rank, tp included (a tp group shares its tokens
            # and splits their FLOPs), as the planner prices tokens/s/GPU and MFU.
            tps = tokens_per_step / env.world_size / elapsed
            record = StepMetrics(
                step=step,
                loss=stats[0].item() / env.world_size,
                grad_norm=result.grad_norm,
                lr=lr,
                step_time_s=elapsed,
                tokens_per_s_per_gpu=tps,
                mfu=mfu(
                    tps, flops_per_token=flops_per_token, peak_tflops=plan.cluster.gpu_spec.peak_bf16_tflops
                ),
                peak_memory_gib=meter.last_gib,
                memory_source=meter.source,
                tokens_seen=step * tokens_per_step,
                peak_allocated_gib=meter.last_allocated_gib,
                synthetic_data=data.synthetic,
            )
            if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                tracker.enter("eval", step)
                started = time.perf_counter()
                record.eval_loss = evaluate(
                    par,
                    data,
                    batches=args.eval_batches,
                    dp_rank=dp_rank,
                    dp_size=dp_size,
                    micro_batch_size=cfg.micro_batch_size,
                    grad_accum_steps=cfg.grad_accum_steps,
                    loss_chunks=cfg.loss_chunks,
                    device=env.device,
                )
                record.eval_time_s = time.perf_counter() - started
            history.append(record)
            writer.log(record)
            for t in trackers:
                t.log(_scalars(record), step)
            stopping = stats[1].item() > 0
            due = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
            if args.checkpoint_dir and (due or step == args.steps or stopping):
                tracker.enter("checkpoint")
                path = save_checkpoint(
                    args.checkpoint_dir,
                    step=step,
                    model=par.module,
                    optimizer=optimizer,
                    keep=args.keep_checkpoints,
                    train_state={
                        "plan_hash": plan.plan_hash,
                        "seed": args.seed,
                        "data": data.description,
                        "sequences_per_step": training.sequences,
                        "world_size": env.world_size,
                        "tokens_seen": step * tokens_per_step,
                    },
                )
                log0(env, f"  checkpoint saved: {path}")
            if stopping:
                log0(env, f"stop requested (SIGTERM/SIGUSR1): stopped after step {step}")
                break
    finally:
        writer.close()
        for t in trackers:
            t.close()
    _summary(env, plan, history, timing_warmup=args.timing_warmup)
    return 0


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
        # After an OOM the other ranks may be inside a collective this rank will never join: tearing
        # the process group down could wait on them. The caller exits without teardown anyway.
        if dist.is_initialized() and not oom:
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
