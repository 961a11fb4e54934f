"""`fsdp-planner validate`: run a plan's own launcher for a few steps and set measured beside predicted.

The bundle is the one users download (`launch.sh` over torchrun), so validation exercises the
real path. Timing skips warm-up steps (compilation, allocator growth, and on CPU the step whose
memory is profiled); memory is the largest peak any step reported.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from api.cli.common import DEFAULT_SERVER, EXIT_FAILED, ServerClient, fail, load_plan
from executor.launch.bundle import bundle_name, write_bundle
from planner.plan import Plan

DEFAULT_STEPS = 8
DEFAULT_WARMUP = 2


@dataclass(frozen=True)
class Measurement:
    """What a validation run measured (steady-state steps only for time)."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    peak_memory_gib: float | None
    memory_source: str | None
    steps: int
    losses: list[float]
    step_times_s: list[float]


class ValidationError(RuntimeError):
    """The launcher failed or reported nothing to measure."""


def summarize(metrics: list[dict[str, Any]], *, warmup: int) -> Measurement:
    """Median step time and throughput after `warmup` steps; the largest reported peak memory."""
    if len(metrics) <= warmup:
        raise ValidationError(
            f"the run reported {len(metrics)} step(s), fewer than the {warmup} warm-up steps plus one "
            "to time; raise --steps"
        )
    steady = metrics[warmup:]
    peaks = [m["peak_memory_gib"] for m in metrics if m.get("peak_memory_gib") is not None]
    return Measurement(
        step_time_s=statistics.median(m["step_time_s"] for m in steady),
        tokens_per_s_per_gpu=statistics.median(m["tokens_per_s_per_gpu"] for m in steady),
        peak_memory_gib=max(peaks) if peaks else None,
        memory_source=next((m.get("memory_source") for m in metrics if m.get("memory_source")), None),
        steps=len(steady),
        losses=[m["loss"] for m in metrics],
        step_times_s=[m["step_time_s"] for m in metrics],
    )


def run_validation(
    plan: Plan,
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    workdir: Path,
    python: str = sys.executable,
    trainer_args: tuple[str, ...] = (),
    timeout_s: float | None = None,
) -> Measurement:
    """Write the plan's torchrun bundle into `workdir`, run `launch.sh`, and measure it."""
    if plan.cluster.num_nodes > 1:
        raise ValidationError(
            f"this plan spans {plan.cluster.num_nodes} nodes; validate runs one node. Run the bundle's "
            "slurm.sbatch (or launch.sh on every node) with `--metrics-file`, then upload with the runs API"
        )
    workdir = workdir.resolve()  # launch.sh changes into the bundle: every path it gets must be absolute
    write_bundle(plan, workdir, target="torchrun")
    bundle = workdir / bundle_name(plan)
    metrics_file = workdir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    command = [
        "bash",
        str(bundle / "launch.sh"),
        "--steps",
        str(steps),
        "--metrics-file",
        str(metrics_file),
        # On CPU, profile memory on one early step only: profiling slows the steps it watches.
        "--memory-every",
        "0",
        *trainer_args,
    ]
    env = {**os.environ, "NPROC_PER_NODE": str(plan.cluster.gpus_per_node), "PYTHON": python}
    result = subprocess.run(command, env=env, check=False, timeout=timeout_s)
    if result.returncode != 0:
        raise ValidationError(f"the launcher exited with status {result.returncode}; its output is above")
    if not metrics_file.exists():
        raise ValidationError(f"the launcher wrote no metrics to {metrics_file}")
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return summarize(lines, warmup=warmup)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(
    plan_file: Annotated[Path | None, typer.Option("--plan", help="A plan JSON file.")] = None,
    plan_id: Annotated[
        int | None, typer.Option("--plan-id", help="A stored plan's id (with --server).")
    ] = None,
    server: Annotated[str, typer.Option(help="fsdp-planner server URL.")] = DEFAULT_SERVER,
    steps: Annotated[int, typer.Option(help="Optimizer steps to run.")] = DEFAULT_STEPS,
    warmup: Annotated[int, typer.Option(help="Leading steps left out of the timing.")] = DEFAULT_WARMUP,
    upload: Annotated[bool, typer.Option(help="Store the run on the server (needs --plan-id).")] = False,
    api_key: Annotated[str | None, typer.Option("--api-key", help="API key for --upload.")] = None,
    keep: Annotated[Path | None, typer.Option(help="Keep the bundle and metrics in this directory.")] = None,
) -> None:
    """Run the plan's launcher for a few steps and report measured vs predicted."""
    if steps <= warmup or warmup < 0:
        raise fail(f"--steps ({steps}) must exceed --warmup ({warmup}), which cannot be negative")
    if upload and plan_id is None:
        raise fail("--upload stores the run with its plan on the server: use --plan-id ID (not --plan FILE)")
    plan = load_plan(plan_file, plan_id, server, api_key)
    console = Console()
    if plan.cluster.gpu == "cpu" and plan.training.precision == "bf16":
        console.print(
            "[yellow]note:[/] this plan assumes bf16 but CPU runs train in float32, so time and memory "
            "differ from the prediction; plan CPU runs with --precision fp32"
        )
    try:
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            measured = run_validation(plan, steps=steps, warmup=warmup, workdir=keep)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                measured = run_validation(plan, steps=steps, warmup=warmup, workdir=Path(tmp))
    except ValidationError as exc:
        raise fail(str(exc), EXIT_FAILED) from None
    show(plan, measured, console)
    if upload:
        body = {
            "measured_step_time_s": measured.step_time_s,
            "measured_tokens_per_s_per_gpu": measured.tokens_per_s_per_gpu,
            "measured_peak_memory_gib": measured.peak_memory_gib,
            "steps": measured.steps,
            "raw": {
                "step_times_s": measured.step_times_s,
                "losses": measured.losses,
                "memory_source": measured.memory_source,
                "warmup_steps": warmup,
            },
        }
        run = ServerClient(server, api_key).post(f"/plans/{plan_id}/runs", body)
        console.print(f"Stored as validation run {run['id']} of plan {plan_id}")


def _error(predicted: float, measured: float | None) -> str:
    if not measured:
        return "-"
    return f"{(predicted - measured) / measured:+.1%}"


def show(plan: Plan, measured: Measurement, console: Console) -> None:
    pred = plan.prediction
    table = Table(
        title=f"{plan.config.label()} on {plan.cluster.world_size} x {plan.cluster.gpu}", title_justify="left"
    )
    for column in ("", "predicted", "measured", "error"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row(
        "step time",
        f"{pred.step_time_s:.4f} s",
        f"{measured.step_time_s:.4f} s",
        _error(pred.step_time_s, measured.step_time_s),
    )
    table.add_row(
        "tokens/s/GPU",
        f"{pred.tokens_per_s_per_gpu:,.0f}",
        f"{measured.tokens_per_s_per_gpu:,.0f}",
        _error(pred.tokens_per_s_per_gpu, measured.tokens_per_s_per_gpu),
    )
    memory = f"{measured.peak_memory_gib:.3f} GiB" if measured.peak_memory_gib is not None else "-"
    table.add_row(
        "peak memory",
        f"{pred.peak_memory_gib:.3f} GiB",
        memory,
        _error(pred.peak_memory_gib, measured.peak_memory_gib),
    )
    console.print(table)
    console.print(
        f"[dim]{measured.steps} timed steps after warm-up; loss {measured.losses[0]:.3f} -> "
        f"{measured.losses[-1]:.3f}; memory from {measured.memory_source or 'nothing'}[/]"
    )
