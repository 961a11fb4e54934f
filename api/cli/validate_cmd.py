"""`fsdp-planner validate`: run a plan's own launcher for a few steps and set measured beside predicted.

The bundle is the one users download (`launch.sh` over torchrun), so validation exercises the
real path. Timing skips warm-up steps (compilation, allocator growth, and on CPU the step whose
memory is profiled); memory is the largest peak any step reported.

A run that runs out of memory is a verdict, not an error: the trainer's `{"event": "oom"}` record
is read from the metrics file, printed, uploaded as an OOM run with --upload, and the command
exits with EXIT_OOM (5). torchrun itself exits 1 whatever its workers did, so the record, not the
exit status, says what happened.
"""

from __future__ import annotations

import json
import math
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

from api.cli.common import (
    DEFAULT_SERVER,
    EXIT_FAILED,
    EXIT_OOM,
    SERVER_ENV,
    STORED_ID,
    ServerClient,
    cpu_precision_note,
    decimal_number,
    fail,
    load_plan,
    whole_number,
)
from api.cli.plan_cmd import within
from api.cli.printing import stdout_console
from executor.launch.bundle import bundle_name, write_bundle
from planner.bounds import MAX_MEMORY_GIB, MIN_DEVICE_MEMORY_GIB
from planner.formatting import duration
from planner.plan import Plan, PredictionInterval

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
    timed_steps: tuple[int, int] = (0, 0)
    """The first and last step (1-based, as the trainer numbers them) behind the medians."""


class ValidationError(RuntimeError):
    """The launcher failed or reported nothing to measure."""


class RanOutOfMemory(RuntimeError):
    """The launcher ran out of memory: `record` is the first failing rank's OOM record."""

    def __init__(self, record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
        super().__init__(f"out of memory at step {record.get('step')} ({record.get('phase')})")
        self.record = record
        self.steps = steps
        """The steps that completed before it (rank 0's lines)."""


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
        timed_steps=(steady[0].get("step", warmup + 1), steady[-1].get("step", len(metrics))),
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
    data: Path | None = None,
) -> Measurement:
    """Write the plan's torchrun bundle into `workdir`, run `launch.sh`, and measure it: on synthetic
    tokens (`--synthetic-data`, said explicitly: validation measures speed and memory, which do not
    depend on the tokens), or on the dataset `data` when given."""
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
        # The trainer's closing line then reports the same median over the same steps as this command.
        "--timing-warmup",
        str(warmup),
        *(("--data", str(data.resolve())) if data is not None else ("--synthetic-data",)),
        *trainer_args,
    ]
    env = {**os.environ, "NPROC_PER_NODE": str(plan.cluster.gpus_per_node), "PYTHON": python}
    result = subprocess.run(command, env=env, check=False, timeout=timeout_s)
    lines = _read_metrics(metrics_file)
    ooms = [line for line in lines if line.get("event") == "oom"]
    if ooms:
        # Every failing rank writes one; the earliest (by step, then time) is where it started.
        first = min(ooms, key=lambda r: (r.get("step") is None, r.get("step") or 0, r.get("time", 0.0)))
        raise RanOutOfMemory(first, [line for line in lines if "event" not in line])
    if result.returncode != 0:
        raise ValidationError(f"the launcher exited with status {result.returncode}; its output is above")
    if not metrics_file.exists():
        raise ValidationError(f"the launcher wrote no metrics to {metrics_file}")
    return summarize(lines, warmup=warmup)


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:  # a line cut short by a killed rank
            continue
    return lines


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(
    plan_file: Annotated[Path | None, typer.Option("--plan", help="A plan JSON file.")] = None,
    plan_id: Annotated[
        int | None, typer.Option(
            "--plan-id", parser=STORED_ID, help="A stored plan's id (with --server).",
        )
    ] = None,
    server: Annotated[str, typer.Option(help="fsdp-planner server URL.", envvar=SERVER_ENV)] = DEFAULT_SERVER,
    steps: Annotated[int, typer.Option(
        parser=whole_number(unit="optimizer steps", low=1), help="Optimizer steps to run.",
    )] = DEFAULT_STEPS,
    warmup: Annotated[int, typer.Option(
        parser=whole_number(unit="optimizer steps"), help="Leading steps left out of the timing.",
    )] = DEFAULT_WARMUP,
    upload: Annotated[bool, typer.Option(help="Store the run on the server (needs --plan-id).")] = False,
    api_key: Annotated[str | None, typer.Option("--api-key", help="API key for --upload.")] = None,
    keep: Annotated[Path | None, typer.Option(help="Keep the bundle and metrics in this directory.")] = None,
    model_factory: Annotated[
        str | None,
        typer.Option("--model-factory", help="package.module:function building your model (traced plans)."),
    ] = None,
    max_memory_gib: Annotated[
        float | None,
        typer.Option(
            "--max-memory-gib",
            parser=decimal_number(unit="GiB per GPU", low=MIN_DEVICE_MEMORY_GIB, high=MAX_MEMORY_GIB),
            help="CUDA: cap each GPU at this many GiB (rehearse a smaller GPU)",
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Train on this dataset (`fsdp-planner prepare-data`) instead of synthetic tokens; speed "
            "and memory are the same either way.",
        ),
    ] = None,
) -> None:
    """Run the plan's launcher for a few steps and report measured vs predicted.

    Exit status: 0 measured; 5 the run ran out of memory (stored as an OOM run with --upload; then
    `fsdp-planner replan PLAN_ID`); 1 the launcher failed otherwise; 2 invalid options.
    """
    if steps <= warmup or warmup < 0:
        raise fail(f"--steps ({steps}) must exceed --warmup ({warmup}), which cannot be negative")
    if upload and plan_id is None:
        raise fail("--upload stores the run with its plan on the server: use --plan-id ID (not --plan FILE)")
    plan = load_plan(plan_file, plan_id, server, api_key)
    console = stdout_console()
    if note := cpu_precision_note(plan):
        console.print(f"[yellow]note:[/] {note}")
    trainer_args: tuple[str, ...] = ()
    if model_factory:
        trainer_args += ("--model-factory", model_factory)
    if max_memory_gib is not None:
        trainer_args += ("--max-memory-gib", str(max_memory_gib))
    try:
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            measured = run_validation(
                plan, steps=steps, warmup=warmup, workdir=keep, trainer_args=trainer_args, data=data
            )
        else:
            with tempfile.TemporaryDirectory() as tmp:
                measured = run_validation(
                    plan, steps=steps, warmup=warmup, workdir=Path(tmp), trainer_args=trainer_args, data=data
                )
    except ValidationError as exc:
        raise fail(str(exc), EXIT_FAILED) from None
    except RanOutOfMemory as oom:
        show_oom(plan, oom.record, console)
        if upload:
            run = ServerClient(server, api_key).post(f"/plans/{plan_id}/runs", oom_body(oom))
            console.print(f"Stored as out-of-memory run {run['id']} of plan {plan_id}; re-plan without "
                          f"configurations as memory-hungry: fsdp-planner replan {plan_id} --server {server}")
        raise typer.Exit(EXIT_OOM) from None
    show(plan, measured, console)
    if upload:
        body = {
            "measured_step_time_s": measured.step_time_s,
            "measured_tokens_per_s_per_gpu": measured.tokens_per_s_per_gpu,
            "measured_peak_memory_gib": measured.peak_memory_gib,
            "steps": measured.steps,
            "raw": {
                "step_times_s": measured.step_times_s,
                "losses": finite_or_null(measured.losses),
                "memory_source": measured.memory_source,
                "warmup_steps": warmup,
            },
        }
        run = ServerClient(server, api_key).post(f"/plans/{plan_id}/runs", body)
        console.print(f"Stored as validation run {run['id']} of plan {plan_id}")


def oom_body(oom: RanOutOfMemory) -> dict[str, Any]:
    """The runs API body of an out-of-memory run."""
    record = oom.record
    peaks = [s["peak_memory_gib"] for s in oom.steps if s.get("peak_memory_gib") is not None]
    return {
        "outcome": "oom",
        "steps": len(oom.steps),
        "measured_peak_memory_gib": max(peaks) if peaks else None,
        "oom": {
            "step": record.get("step"),
            "phase": record.get("phase") or "unknown",
            "requested_bytes": record.get("requested_bytes"),
            "allocated_bytes": record.get("allocated_bytes"),
            "reserved_bytes": record.get("reserved_bytes"),
            "message": str(record.get("message", ""))[:2000],
        },
        "raw": {"oom_record": record, "losses": finite_or_null([s.get("loss") for s in oom.steps])},
    }


def finite_or_null(losses: list[Any]) -> list[Any]:
    """`losses` with NaN and infinities (a diverged run) as None: the runs API refuses numbers JSON lacks."""
    return [None if isinstance(loss, float) and not math.isfinite(loss) else loss for loss in losses]


def _gib(n: int | None) -> str:
    return f"{n / 1024**3:.2f} GiB" if n is not None else "?"


def show_oom(plan: Plan, record: dict[str, Any], console: Console) -> None:
    """The verdict: where it ran out, what it asked for, and what the plan had predicted."""
    step = record.get("step")
    where = f"step {step}" if step is not None else "start-up"
    line = f"OUT OF MEMORY at {where} ({record.get('phase')}) on rank {record.get('rank')}"
    details = []
    if record.get("requested_bytes") is not None:
        details.append(f"tried to allocate {_gib(record['requested_bytes'])}")
    if record.get("allocated_bytes") is not None:
        reserved = _gib(record.get("reserved_bytes"))
        details.append(f"{_gib(record['allocated_bytes'])} allocated, {reserved} reserved")
    if record.get("memory_limit_bytes") is not None:
        details.append(f"capped at {_gib(record['memory_limit_bytes'])}")
    pred = plan.prediction
    details.append(
        f"predicted peak {pred.peak_memory_gib:.2f} GiB per GPU of "
        f"{plan.cluster.gpu_spec.memory_gib:.0f} GiB ({plan.config.label()})"
    )
    console.print(f"[bold red]{line}[/]: " + "; ".join(details), highlight=False, soft_wrap=True)


def _error(predicted: float, measured: float | None) -> str:
    if not measured:
        return "-"
    return f"{(predicted - measured) / measured:+.1%}"


def _inside(interval: PredictionInterval | None, measured: float | None) -> str:
    """Whether the measurement fell inside the plan's 80% interval (plans before schema 2.2: nothing)."""
    if interval is None or measured is None:
        return ""
    return ", inside 80%" if interval.low <= measured <= interval.high else ", OUTSIDE 80%"


def show(plan: Plan, measured: Measurement, console: Console) -> None:
    pred = plan.prediction
    table = Table(
        title=f"{plan.config.label()} on {plan.cluster.world_size} x {plan.cluster.gpu}", title_justify="left"
    )
    for column in ("", "predicted", "measured", "error"):
        table.add_column(column, justify="left" if not column else "right")
    first, last = measured.timed_steps
    table.add_row(
        f"step time (median, steps {first}-{last})",
        duration(pred.step_time_s),
        duration(measured.step_time_s),
        _error(pred.step_time_s, measured.step_time_s),
    )
    table.add_row(
        "tokens/s/GPU",
        f"{pred.tokens_per_s_per_gpu:,.0f}{within(pred.tokens_per_s_per_gpu_interval)}",
        f"{measured.tokens_per_s_per_gpu:,.0f}",
        _error(pred.tokens_per_s_per_gpu, measured.tokens_per_s_per_gpu)
        + _inside(pred.tokens_per_s_per_gpu_interval, measured.tokens_per_s_per_gpu),
    )
    memory = f"{measured.peak_memory_gib:.3f} GiB" if measured.peak_memory_gib is not None else "-"
    table.add_row(
        "peak memory",
        f"{pred.peak_memory_gib:.3f} GiB{within(pred.peak_memory_gib_interval, decimals=2)}",
        memory,
        _error(pred.peak_memory_gib, measured.peak_memory_gib)
        + _inside(pred.peak_memory_gib_interval, measured.peak_memory_gib),
    )
    console.print(table)
    console.print(
        f"[dim]measured: median over the {measured.steps} steady steps after {first - 1} warm-up (the "
        f"trainer's `done:` line reports the same; --upload stores it); loss {measured.losses[0]:.3f} -> "
        f"{measured.losses[-1]:.3f}; memory from {measured.memory_source or 'nothing'}[/]"
    )
