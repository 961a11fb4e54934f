"""Benchmark: the uncalibrated cost model against the corpus of measured runs (not a test; run on demand).

    python bench/fidelity.py            # markdown tables on stdout (about a minute: leave-one-source-out)
    python bench/fidelity.py --no-loso  # in-sample only (a second)

Prints what bench/RESULTS.md records: errors per GPU type and quantity for the fit split (in-sample
and leave-one-source-out) and the held-out split (sources no fit reads), how many held-out runs the
80% interval contains, the targets, and the largest misses with their configurations.
"""

from __future__ import annotations

import argparse
import platform
from datetime import UTC, datetime

from planner import PLANNER_VERSION
from planner.fidelity.report import FidelityReport, build_report


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}" if value < 0 else f"{value:.1%}"


def markdown(report: FidelityReport, *, misses: int) -> str:
    lines = [
        f"planner {PLANNER_VERSION}, {report.sources} sources, "
        f"{sum(r.priced for r in report.runs)} of {len(report.runs)} runs priced; "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()} (pure Python: no GPU involved)",
        "",
        "| GPU | quantity | runs | mean abs error | max abs error | bias | leave-one-source-out mean |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in (*report.by_gpu, *report.by_quantity):
        lines.append(
            f"| {s.group} | {s.quantity} | {s.runs} | {s.mean_abs:.1%} | {s.max_abs:.1%} | {_pct(s.bias)} "
            f"| {'–' if s.loso_mean_abs is None else f'{s.loso_mean_abs:.1%}'} |"
        )
    lines += [
        "", "Held-out split (sources no fit reads, priced by the committed fit):", "",
        "| GPU | quantity | runs | mean abs error | max abs error | bias |", "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {s.group} | {s.quantity} | {s.runs} | {s.mean_abs:.1%} | {s.max_abs:.1%} | {_pct(s.bias)} |"
        for s in (*report.held_out_by_gpu, *report.held_out_by_quantity)
    ]
    lines += [""] + [
        f"80% interval: {c.covered} of {c.runs} held-out {c.quantity} runs inside ({c.fraction:.0%}), each "
        "calibrated without its source" for c in report.coverage
    ]
    lines += ["", "| target | goal | value | met |", "|---|---|---|---|"]
    lines += [f"| {t.name} | {t.target} | {t.value} | {'yes' if t.met else 'NO'} |" for t in report.targets]
    worst = sorted(
        (r for r in report.runs if r.throughput_error is not None),
        key=lambda r: abs(r.throughput_error or 0.0), reverse=True,
    )[:misses]
    lines += ["", "| largest throughput misses | split | GPU | configuration | error |",
              "|---|---|---|---|---:|"]
    lines += [
        f"| {r.source}/{r.run_id} | {r.split} | {r.gpu} | {r.config} | {_pct(r.throughput_error)} |"
        for r in worst
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-loso", action="store_true", help="skip leave-one-source-out refits")
    parser.add_argument("--misses", type=int, default=8, help="how many of the largest misses to list")
    args = parser.parse_args()
    print(markdown(build_report(loso=not args.no_loso), misses=args.misses))


if __name__ == "__main__":
    main()
