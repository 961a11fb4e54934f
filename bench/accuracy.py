"""Benchmark: how well the calibrated cost model predicts real runs (not a test; run on demand).

    python bench/accuracy.py [--budget-s 60] [--steps 10] [--passes 2] [--out bench/out/accuracy] [--write]
    python bench/accuracy.py --cluster 1x8xH100 --precision bf16 --model gpt2-large --seq-len 1024

By default (this CPU machine): calibrate once (2 CPU ranks, gloo), then run 12 configurations of a small Llama
that differ in sharding, wrap unit, micro-batch, checkpointing and compile, each through its own
launch bundle (`launch.sh`), none of them used in fitting. Reports predicted vs measured step time
and peak memory per configuration, the mean absolute percentage errors, the Spearman rank
correlation of step times, and the regret of the planner's choice (how much slower, measured, the
configuration the model ranks first is than the fastest measured one). `--write` records the
result in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import date
from pathlib import Path

from api.cli.validate_cmd import Measurement, ValidationError, run_validation
from contract.mesh import Mesh
from contract.parallel_config import CheckpointingConfig, InductorConfig, ParallelConfig
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.plan import Plan
from planner.search import predict
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec

MODEL = ModelSpec(
    name="llama-small",
    architecture="llama",
    vocab_size=4096,
    hidden_size=256,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    intermediate_size=768,
    max_seq_len=1024,
)
SEQ_LEN = 256
SEQUENCES_PER_RANK = 4  # the configurations split them as 4x1, 2x2 and 1x4
# (sharding, blocks per unit, checkpointing, every_k, micro-batch, compile)
CONFIGS = [
    ("full_shard", 1, "none", 1, 4, False),
    ("full_shard", 2, "none", 1, 2, False),
    ("full_shard", 1, "full", 1, 4, False),
    ("full_shard", 4, "op_selective", 1, 4, False),
    ("shard_grad_op", 1, "none", 1, 4, False),
    ("shard_grad_op", 2, "selective", 2, 2, False),
    ("no_shard", 1, "none", 1, 4, False),
    ("no_shard", 1, "full", 1, 1, False),
    ("full_shard", 1, "none", 1, 4, True),
    ("shard_grad_op", 1, "none", 1, 2, True),
    ("no_shard", 1, "none", 1, 4, True),
    ("full_shard", 2, "full", 1, 4, True),
]


def config(
    sharding: str,
    unit: int,
    ac: str,
    every_k: int,
    micro_batch: int,
    compiled: bool,
    *,
    world: int,
    precision: str,
) -> ParallelConfig:
    shard = 1 if sharding == "no_shard" else world
    return ParallelConfig(
        sharding=sharding,
        mesh=Mesh(dp_replicate=world // shard, dp_shard=shard),
        blocks_per_unit=unit,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        reshard_after_forward=sharding == "full_shard",
        prefetch_depth=1,
        checkpointing=CheckpointingConfig(mode=ac, every_k=every_k),
        micro_batch_size=micro_batch,
        grad_accum_steps=SEQUENCES_PER_RANK // micro_batch,
        param_dtype="bfloat16" if precision == "bf16" else "float32",
        reduce_dtype="float32",
        compile=compiled,
        inductor=InductorConfig(
            bucket_all_gathers=False,
            bucket_reduce_scatters=False,
            reorder_for_compute_comm_overlap=compiled and sharding != "no_shard",
        ),
    )


def calibrate(
    out: Path, budget_s: float, *, model: ModelSpec, seq_len: int, nproc: int
) -> CalibrationProfile:
    model_file = out / "model.json"
    model_file.write_text(model.model_dump_json())
    profile_file = out / "profile.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "executor.profile.run",
            "-o",
            str(profile_file),
            "--budget-s",
            str(budget_s),
            "--model-json",
            str(model_file),
            "--seq-len",
            str(seq_len),
            "--micro-batches",
            "1,2,4",
            "--name",
            "bench-cpu",
        ],
        check=True,
        env={"OMP_NUM_THREADS": "1", **os.environ},
    )
    return CalibrationProfile.model_validate_json(profile_file.read_text())


def measure(plan: Plan, *, args: argparse.Namespace, workdir: Path) -> Measurement:
    """One validation run of `plan`; a failed run is retried once and reported, so that one rare
    crash (see bench/RESULTS.md) does not throw away a long benchmark."""
    try:
        return run_validation(plan, steps=args.steps, warmup=args.warmup, workdir=workdir)
    except ValidationError as exc:
        print(f"run failed ({exc}); retrying once", flush=True)
        return run_validation(plan, steps=args.steps, warmup=args.warmup, workdir=workdir)


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        r = [0.0] * len(values)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True))
    return 1 - 6 * d2 / (n * (n * n - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=60.0, help="calibration time budget")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--passes", type=int, default=2, help="runs per configuration (the faster counts)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/accuracy"))
    parser.add_argument("--cluster", default="1x2xcpu", help="one node: 1xNxGPU (e.g. 1x8xH100)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--model", default=None, help="catalog model (default: llama-small, 8 layers)")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--write", action="store_true", help="record the result in bench/RESULTS.md")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    cluster = ClusterSpec.parse(args.cluster)
    if cluster.num_nodes != 1:
        parser.error("--cluster: validation runs one node; use 1xNxGPU")
    model = resolve_model(args.model) if args.model else MODEL
    world = cluster.world_size
    profile = calibrate(args.out, args.budget_s, model=model, seq_len=args.seq_len, nproc=world)
    request = PlanRequest(
        model=model,
        cluster=cluster,
        training=TrainingSpec(
            seq_len=args.seq_len,
            global_batch_tokens=args.seq_len * SEQUENCES_PER_RANK * world,
            precision=args.precision,
        ),
    )
    plans = [
        predict(
            request,
            config(*spec, world=world, precision=args.precision),
            calibration=profile,
            calibration_id="bench",
        )
        for spec in CONFIGS
    ]
    # Each configuration runs once per pass, the passes in opposite orders, and keeps its faster
    # run: on a shared machine a run can be slowed by a neighbour for tens of seconds, never sped up.
    runs: list[list[Measurement]] = [[] for _ in plans]
    for number in range(args.passes):
        order = range(len(plans)) if number % 2 == 0 else reversed(range(len(plans)))
        for index in order:
            print(f"[pass {number + 1}, {index + 1}/{len(plans)}] {plans[index].config.label()}", flush=True)
            runs[index].append(measure(plans[index], args=args, workdir=args.out / f"run{index}"))
    rows: list[tuple[Plan, Measurement]] = [
        (plan, min(measured, key=lambda m: m.step_time_s)) for plan, measured in zip(plans, runs, strict=True)
    ]

    lines = [
        "| configuration | predicted step s | measured step s | error | predicted GiB | measured GiB "
        "| error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    time_errors, memory_errors = [], []
    for plan, m in rows:
        p = plan.prediction
        te = (p.step_time_s - m.step_time_s) / m.step_time_s
        time_errors.append(abs(te))
        me = None
        if m.peak_memory_gib:
            me = (p.peak_memory_gib - m.peak_memory_gib) / m.peak_memory_gib
            memory_errors.append(abs(me))
        lines.append(
            f"| {plan.config.label()} | {p.step_time_s:.3f} | {m.step_time_s:.3f} | {te:+.1%} | "
            f"{p.peak_memory_gib:.3f} | {m.peak_memory_gib or 0:.3f} | "
            f"{'-' if me is None else f'{me:+.1%}'} |"
        )
    predicted = [plan.prediction.step_time_s for plan, _ in rows]
    measured = [m.step_time_s for _, m in rows]
    rho = spearman(predicted, measured)
    choice = min(range(len(rows)), key=lambda i: predicted[i])
    regret = measured[choice] / min(measured) - 1
    summary = (
        f"step-time MAPE {sum(time_errors) / len(time_errors):.1%} (max {max(time_errors):.1%}); "
        f"memory MAPE {sum(memory_errors) / max(len(memory_errors), 1):.1%} "
        f"(max {max(memory_errors, default=0):.1%}); Spearman rho (step time) {rho:.2f}; "
        f"planner's choice: {rows[choice][0].config.label()}, regret {regret:.1%}"
    )
    table = "\n".join(lines)
    print(table)
    print(summary)
    (args.out / "result.json").write_text(
        json.dumps(
            {
                "rows": [
                    {
                        "config": plan.config.label(),
                        "predicted_step_s": plan.prediction.step_time_s,
                        "measured_step_s": m.step_time_s,
                        "predicted_gib": plan.prediction.peak_memory_gib,
                        "measured_gib": m.peak_memory_gib,
                    }
                    for plan, m in rows
                ],
                "summary": summary,
            },
            indent=2,
        )
    )
    if args.write:
        results = Path("bench/RESULTS.md")
        fp = profile.fingerprint
        section = (
            f"\n## Cost-model accuracy on {fp.device_name} x{fp.device_count} (`bench/accuracy.py`)\n\n"
            f"Machine: {fp.device_name} x{fp.device_count}, {fp.backend}, torch {fp.torch_version}; "
            f"{date.today()}; Python {platform.python_version()}. Model: {model.name} ({model.num_layers} "
            f"layers, hidden {model.hidden_size}), seq {args.seq_len}, {SEQUENCES_PER_RANK} sequences per "
            f"rank per step, {args.precision}. Calibrated once "
            f"({args.budget_s:.0f} s budget); each configuration ran {args.steps} steps through its own "
            f"launch.sh, the first {args.warmup} left out of the timing (median of the rest), in "
            f"{args.passes} passes in alternating order, the faster pass counting."
            f"\n\n{table}\n\n**{summary}**\n"
        )
        results.write_text(results.read_text() + section)


if __name__ == "__main__":
    main()
