"""Benchmark: the pipeline pricing against the corpus's published pipeline-parallel runs (not a test).

    python bench/pipeline_fidelity.py            # print the table
    python bench/pipeline_fidelity.py --markdown  # the same as a Markdown table (for bench/RESULTS.md)

Every corpus run with pp > 1 (marked not priceable while the planner had no pipelines) priced at its
exact configuration: its mesh, schedule, stages per rank and micro-batching as published, the stage
split the planner balances (sources do not say where the blocks went), its Float8 recipe where it
used one (torchao's tensorwise in torchtitan), the engine it ran on. Runs of other engines
(Megatron-Core with Transformer Engine) are listed apart: the planner prices torchao and FSDP2.
Beside each: the bubble and sends the prediction holds, so a schedule's error can be told from the
rest of the step's.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from planner.errors import PlanningError
from planner.fidelity.pricing import price_as_run
from planner.fidelity.schema import Run, load_corpus
from planner.plan import Plan

TORCHAO_ENGINE = "torchtitan-fsdp2"


@dataclass(frozen=True)
class Row:
    run: Run
    plan: Plan

    @property
    def measured(self) -> float | None:
        return self.run.measured.tokens_per_s_per_gpu

    @property
    def predicted(self) -> float:
        return self.plan.prediction.tokens_per_s_per_gpu

    @property
    def error(self) -> float | None:
        return self.predicted / self.measured - 1.0 if self.measured else None

    @property
    def memory_error(self) -> float | None:
        measured = self.run.measured.peak_memory_gib
        return self.plan.prediction.peak_memory_gib / measured - 1.0 if measured else None

    @property
    def other_engine(self) -> bool:
        return self.run.config.engine != TORCHAO_ENGINE


def rows() -> list[Row]:
    found = []
    for source in load_corpus():
        for run in source.runs:
            if run.config.mesh.pp == 1:
                continue
            try:
                plan = price_as_run(run).plan  # with its recipe
            except PlanningError as exc:
                print(f"skipped {run.id}: {exc.message}")
                continue
            found.append(Row(run, plan))
    return found


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    table = rows()
    header = ("run", "schedule", "seq", "measured tok/s/GPU", "predicted", "error", "bubble / step",
              "memory measured / predicted GiB")
    lines = []
    for row in table:
        config, prediction = row.plan.config, row.plan.prediction
        assert config.pipeline is not None
        memory = row.run.measured.peak_memory_gib
        measured_memory = f"{memory:.1f}" if memory is not None else "-"
        schedule = f"{config.pipeline.label()} pp{config.mesh.pp}"
        lines.append((
            row.run.id + (" (other engine)" if row.other_engine else ""),
            f"{schedule} m{config.grad_accum_steps} x mb{config.micro_batch_size}",
            f"{row.run.config.seq_len:,}",
            f"{row.measured:,.0f}" if row.measured else "-",
            f"{row.predicted:,.0f}",
            _percent(row.error),
            f"{prediction.pipeline_bubble_s / prediction.step_time_s:.0%}",
            f"{measured_memory} / {prediction.peak_memory_gib:.1f} ({_percent(row.memory_error)})",
        ))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| " + " | ".join("---" for _ in header) + " |")
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        for line in (header, *lines):
            print("  ".join(str(cell) for cell in line))
    torchao = [abs(r.error) for r in table if r.error is not None and not r.other_engine]
    if torchao:
        within = sum(e <= 0.15 for e in torchao)
        mean = statistics.mean(torchao)
        print(f"\ntorchtitan runs: mean |error| {mean:.1%}, {within}/{len(torchao)} within 15%")


if __name__ == "__main__":
    main()
