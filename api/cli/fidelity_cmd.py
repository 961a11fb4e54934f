"""`fsdp-planner fidelity`: how close the planner's predictions are to training runs measured on GPUs.

Prices every run of the corpus (planner/fidelity/corpus) at its exact configuration, live, and prints the
errors per GPU type and per quantity for the fit split (in-sample and leave-one-source-out) beside the
held-out split (sources no fit reads: planner/fidelity/split.json), per source, how many held-out runs
the 80% interval contains, the mixture-of-experts runs apart (per source), the targets the project holds
itself to, and with `--runs` every run.
`--write` stores the report as the one the service serves (`GET /api/v1/fidelity`, the dashboard's
accuracy page) and the intervals' quantiles every plan reads (planner/fidelity/intervals.json), which
tests keep in step with the code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from api.cli.printing import stdout_console
from planner import fidelity as fidelity_package
from planner.fidelity.report import (
    REPORT_RESOURCE,
    ErrorSummary,
    FidelityReport,
    RunResult,
    build_report,
    intervals_json,
    report_json,
)
from planner.formatting import between
from planner.uncertainty import INTERVALS_RESOURCE

STORED_REPORT_PATH = Path(fidelity_package.__file__).parent / REPORT_RESOURCE
"""The report the service serves, inside the planner.fidelity package (read back by `stored_report`)."""
STORED_INTERVALS_PATH = Path(fidelity_package.__file__).parent / INTERVALS_RESOURCE
"""The intervals' quantiles every plan reads (planner/uncertainty.py `interval_data`)."""


def register(app: typer.Typer) -> None:
    app.command("fidelity")(fidelity)


def fidelity(
    loso: Annotated[bool, typer.Option(
        "--loso/--no-loso",
        help="Also price each source under a fit made without it (leave-one-source-out; about a minute).",
    )] = True,
    runs: Annotated[bool, typer.Option("--runs", help="List every run with its errors.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the report JSON here.")] = None,
    write: Annotated[bool, typer.Option(
        "--write",
        help=f"Store the report as the one the service serves ({STORED_REPORT_PATH}) and the intervals "
        f"plans read ({STORED_INTERVALS_PATH}).",
    )] = False,
) -> None:
    """Price every measured run of the corpus at its exact configuration; errors and targets."""
    if loso:
        # stderr: `--json` output stays parseable.
        Console(stderr=True).print(
            "[dim]pricing every run, then each source under a fit made without it "
            "(about a minute; --no-loso skips it)[/]"
        )
    report = build_report(loso=loso)
    document = report_json(report)
    written = [path for path in (output, STORED_REPORT_PATH if write else None) if path is not None]
    for path in written:
        path.write_text(document, encoding="utf-8")
    if write:
        STORED_INTERVALS_PATH.write_text(intervals_json(report), encoding="utf-8")
        written.append(STORED_INTERVALS_PATH)
    if as_json:
        typer.echo(document, nl=False)
        return
    console = stdout_console()
    print_report(report, console, runs=runs)
    for path in written:
        console.print(f"Report written to {path}", highlight=False)


def _percent(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _summary_table(title: str, summaries: Sequence[ErrorSummary], first: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(first, no_wrap=True)
    table.add_column("quantity")
    for column in ("runs", "mean |err|", "max |err|", "bias", "LOSO mean |err|"):
        table.add_column(column, justify="right", no_wrap=True)
    for s in summaries:
        table.add_row(
            s.group, s.quantity, str(s.runs), _percent(s.mean_abs), _percent(s.max_abs),
            _percent(s.bias, signed=True), _percent(s.loso_mean_abs),
        )
    return table


def _split_table(
    title: str, fit: Sequence[ErrorSummary], held_out: Sequence[ErrorSummary], first: str
) -> Table:
    """The fit split's errors (in-sample, leave-one-source-out) beside the held-out split's."""
    table = Table(title=f"{title}: fit split | held-out split (no fit read it)", title_justify="left")
    table.add_column(first, no_wrap=True)
    table.add_column("quantity")
    for column in ("fit runs", "mean |err|", "max |err|", "LOSO mean", "held-out runs", "mean |err|",
                   "max |err|", "bias"):
        table.add_column(column, justify="right", no_wrap=True)
    rows = {(s.group, s.quantity): (s, None) for s in fit}
    for s in held_out:
        rows[(s.group, s.quantity)] = (rows.get((s.group, s.quantity), (None, None))[0], s)
    for (group, quantity), (f, h) in sorted(rows.items()):
        table.add_row(
            group, quantity,
            str(f.runs) if f else "–", _percent(f and f.mean_abs), _percent(f and f.max_abs),
            _percent(f and f.loso_mean_abs),
            str(h.runs) if h else "–", _percent(h and h.mean_abs), _percent(h and h.max_abs),
            _percent(h and h.bias, signed=True),
        )
    return table


def _runs_table(results: Sequence[RunResult]) -> Table:
    table = Table(title="Runs (error = (predicted − measured) / measured)", title_justify="left")
    for column in ("source", "split", "run", "GPU", "engine", "config"):
        table.add_column(column, overflow="fold")
    for column in ("tok/s/GPU measured", "predicted", "80% interval", "error", "GiB measured", "predicted",
                   "80% interval", "error", ""):
        table.add_column(column, justify="right", no_wrap=True)
    for r in results:
        if not r.priced:
            # Text, not markup: the reason is the corpus' words, brackets and all.
            table.add_row(
                r.source, r.split, r.run_id, r.gpu, r.engine, Text(f"not priced: {r.reason}"), style="dim"
            )
            continue
        table.add_row(
            r.source, r.split, r.run_id, r.gpu, r.engine, r.config,
            _measured_throughput(r), _predicted_throughput(r),
            _range(r.throughput_interval, r.throughput_covered, mfu=r.measured_tokens_per_s_per_gpu is None),
            _percent(r.throughput_error, signed=True),
            _gib(r.measured_memory_gib), _gib(r.predicted_memory_gib),
            _range(r.memory_interval, r.memory_covered, gib=True), _percent(r.memory_error, signed=True),
            "[bold red]exceeds margin[/]" if r.exceeds_margin
            else "network assumed" if r.network_assumed else "",
        )
    return table


def _measured_throughput(r: RunResult) -> str:
    """tokens/s/GPU as measured, or the MFU where only that is published (the error is then MFU's)."""
    if r.measured_tokens_per_s_per_gpu is not None:
        return f"{r.measured_tokens_per_s_per_gpu:,.0f}"
    return f"MFU {r.measured_mfu:.1%}" if r.measured_mfu is not None else "–"


def _predicted_throughput(r: RunResult) -> str:
    if r.measured_tokens_per_s_per_gpu is None and r.measured_mfu is not None and r.predicted_mfu is not None:
        return f"MFU {r.predicted_mfu:.1%}"
    return "–" if r.predicted_tokens_per_s_per_gpu is None else f"{r.predicted_tokens_per_s_per_gpu:,.0f}"


def _range(
    interval: tuple[float, float] | None, covered: bool | None, *, mfu: bool = False, gib: bool = False
) -> str:
    """An interval as every other interval is written (`between`), marked `(out)` where the measured
    value falls outside it."""
    if interval is None:
        return "–"
    low, high = interval
    if mfu:
        text = f"{between(low * 100, high * 100, decimals=1)}%"
    else:
        text = between(low, high, decimals=1 if gib else 0)
    return text if covered else f"{text} (out)"


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _fit_line(fit: dict[str, Any]) -> str:
    """The fitted numbers (the margins' reasons, sentences, are left to `--json`)."""
    parts = []
    for name, value in fit.items():
        if isinstance(value, dict):
            parts.append(f"{name} " + " ".join(f"{k} {v:g}" for k, v in value.items()))
        elif isinstance(value, list | tuple):  # per dimension: margins, and throughput evidence
            parts.append(f"{name} " + " ".join(
                f"{m['dimension']} {m['margin']:g}" if "margin" in m
                else f"{m['dimension']}>={m['degree']} +{m['worst']:.0%}" for m in value
            ))
        elif not isinstance(value, str):
            parts.append(f"{name} {value:g}")
    return ", ".join(parts)


def print_report(report: FidelityReport, console: Console, *, runs: bool = False) -> None:
    """The summaries per GPU type, source and quantity, the targets, and with `runs` every run."""
    priced = sum(1 for r in report.runs if r.priced)
    console.print(
        f"[bold]{len(report.runs)} measured runs[/] from {report.sources} sources, {priced} priced at their "
        f"exact configuration (planner {report.planner_version})"
    )
    console.print(f"corpus fit: {_fit_line(report.fit)}", highlight=False)
    console.print(_split_table("Per GPU type", report.by_gpu, report.held_out_by_gpu, "GPU"))
    console.print(_split_table("Per quantity", report.by_quantity, report.held_out_by_quantity, "group"))
    console.print(_summary_table("Per source", report.by_source, "source"))
    for c in report.coverage:
        console.print(
            f"80% interval: contains {c.covered} of {c.runs} held-out {c.quantity} runs ({c.fraction:.0%}), "
            "each calibrated without its own source", highlight=False,
        )
    if report.moe_by_source:
        console.print(_summary_table(
            "Mixture-of-experts runs (held out; not in the summaries above)",
            [*report.moe_by_source, *report.moe_by_quantity], "source",
        ))
        for c in report.moe_coverage:
            console.print(
                f"80% interval: contains {c.covered} of {c.runs} mixture-of-experts {c.quantity} runs "
                f"({c.fraction:.0%})", highlight=False,
            )
    if report.unseen_gpu_by_gpu:
        console.print(_summary_table(
            "GPU types no fit run measured (dense and mixture-of-experts runs: the catalog's own figures)",
            report.unseen_gpu_by_gpu, "GPU",
        ))
    targets = Table(title="Targets", title_justify="left")
    for column in ("target", "goal", "value", ""):
        targets.add_column(column, overflow="fold")
    for t in report.targets:
        targets.add_row(t.name, t.target, t.value, "[green]met[/]" if t.met else "[bold red]missed[/]")
    console.print(targets)
    if runs:
        console.print(_runs_table(report.runs))
    else:
        console.print("[dim]--runs lists every run; --json prints the whole report.[/]")
