"""Benchmark: the Float8 pricing against the published Float8 runs of the corpus (not a test).

    python bench/float8_fidelity.py            # print the table
    python bench/float8_fidelity.py --markdown  # the same as a Markdown table (for bench/RESULTS.md)

The corpus (planner/fidelity/corpus) holds published Float8 training runs, marked not priceable
while the planner had no Float8. This prices each at its exact configuration with its recipe (and
every bf16 run of the same source beside it, so that a Float8 error can be told from the bf16
error of the same setting), and reports predicted vs measured tokens/s per GPU, the measured and
predicted Float8 speed-up over the source's bf16 run of the same configuration, predicted vs
measured peak memory where the source publishes it (in its own counter, with the margin the plan
would state), and the summary by recipe. Runs that also need pipeline parallelism are left out (not
priced yet), and so are those with context parallelism (bench/RESULTS.md prices them in a section
of their own); runs on other engines (Transformer Engine) are listed apart: the planner prices
torchao's recipes. A run on power-capped cards whose limit the source does not state has no tokens/s
error (its clock is unknown): its Float8 speed-up over the bf16 run on the same cards is compared.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

from planner.cost.parameters import FLOAT8_GEMM_EFFICIENCY
from planner.errors import PlanningError
from planner.fidelity.pricing import FLOAT8_RECIPES, PricedRun, price_as_run
from planner.fidelity.schema import Run, load_corpus

NOT_YET = ("pipeline", "context parallelism")
TORCHAO_ENGINE = "torchtitan-fsdp2"
"""The corpus's engine of the runs that trained with torchao's recipes (the ones the planner prices)."""
RATIOS = tuple(round(0.5 + 0.025 * i, 3) for i in range(21))  # 0.50 .. 1.00: at most the 2x the peaks allow


@dataclass(frozen=True)
class Row:
    source: str
    run: Run
    recipe: str
    predicted: float
    error: float | None
    partner: Run | None
    """The source's bf16 run of the same configuration, if it has one."""
    predicted_partner: float | None
    memory_error: float | None
    """(predicted - measured) / measured peak memory in the run's own counter (None: not published)."""
    exceeds_margin: bool
    """Whether the measured peak is above the predicted one plus the margin the plan states."""

    @property
    def other_engine(self) -> bool:
        """Float8 by another library (Transformer Engine in llm-foundry and Megatron), not torchao."""
        return self.run.config.engine != TORCHAO_ENGINE

    def speedups(self) -> tuple[float, float] | None:
        """(measured, predicted) Float8 over bf16 throughput."""
        if self.partner is None or self.predicted_partner is None:
            return None
        measured, partner = self.run.measured.tokens_per_s_per_gpu, self.partner.measured.tokens_per_s_per_gpu
        if not measured or not partner:
            return None
        return measured / partner, self.predicted / self.predicted_partner

    @property
    def speedup_error(self) -> float | None:
        """(predicted - measured) / measured Float8 speed-up over bf16."""
        speedups = self.speedups()
        return None if speedups is None else speedups[1] / speedups[0] - 1.0


def _price(run: Run) -> PricedRun:
    return price_as_run(run)  # with its recipe (planner/fidelity/pricing.py FLOAT8_RECIPES)


def _partner(run: Run, runs: list[Run]) -> Run | None:
    """The bf16 run of the same source with the same configuration but the precision."""
    same = [r for r in runs if r.config.precision == "bf16"
            and r.config.model_copy(update={"precision": run.config.precision}) == run.config]
    return same[0] if same else None


def rows() -> list[Row]:
    found = []
    for source in load_corpus():
        runs = list(source.runs)
        for run in runs:
            recipe = FLOAT8_RECIPES.get(run.config.precision)
            reason = run.not_priceable_reason or ""
            if recipe is None or any(word in reason for word in NOT_YET):
                continue
            try:
                priced = _price(run)
            except PlanningError as exc:
                print(f"skipped {run.id}: {exc.message}")
                continue
            partner = _partner(run, runs)
            predicted_partner = _price(partner).predicted_tokens_per_s_per_gpu if partner else None
            found.append(Row(source.source.id, run, recipe, priced.predicted_tokens_per_s_per_gpu,
                             priced.throughput_error, partner, predicted_partner, priced.memory_error,
                             priced.exceeds_margin))
    return found


def _speedup_error(table: list[Row]) -> float:
    pairs = [s for s in (r.speedups() for r in table if not r.other_engine) if s]
    return statistics.mean(abs(math.log(predicted / measured)) for measured, predicted in pairs)


def fit() -> None:
    """Print, per recipe, the GEMM efficiency ratio (planner/cost/parameters.py
    FLOAT8_GEMM_EFFICIENCY) whose predicted Float8 speed-ups over the same setting in bf16 best match
    the measured ones (mean |log ratio|): the bf16 model's own error cancels in a speed-up."""
    committed = dict(FLOAT8_GEMM_EFFICIENCY)
    try:
        for recipe in committed:
            scores = {}
            for ratio in RATIOS:
                FLOAT8_GEMM_EFFICIENCY[recipe] = ratio
                table = [r for r in rows() if r.recipe == recipe]
                if any(r.speedups() for r in table if not r.other_engine):
                    scores[ratio] = _speedup_error(table)
            FLOAT8_GEMM_EFFICIENCY[recipe] = committed[recipe]
            if scores:
                best = min(scores, key=scores.__getitem__)
                print(f"{recipe}: best ratio {best} (mean |log speed-up error| {scores[best]:.3f}); "
                      f"committed {committed[recipe]} ({scores.get(committed[recipe], float('nan')):.3f})")
    finally:
        FLOAT8_GEMM_EFFICIENCY.update(committed)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--fit", action="store_true",
                        help="also fit each recipe's GEMM efficiency ratio to the measured speed-ups")
    args = parser.parse_args()
    if args.fit:
        fit()
    table = rows()
    header = ("run", "recipe", "measured tok/s/GPU", "predicted", "error", "speed-up measured / predicted",
              "memory error")
    lines = []
    for row in table:
        speedups = row.speedups()
        lines.append((
            row.run.id + (" (Transformer Engine)" if row.other_engine else ""),
            row.recipe,
            f"{row.run.measured.tokens_per_s_per_gpu or 0:,.0f}",
            f"{row.predicted:,.0f}",
            _percent(row.error) if row.run.throughput_comparable else "- (cap unstated)",
            f"{speedups[0]:.2f}x / {speedups[1]:.2f}x" if speedups else "-",
            _percent(row.memory_error) + (" (above the margin)" if row.exceeds_margin else ""),
        ))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        for line in (header, *lines):
            print(f"{line[0][:72]:72s} {line[1]:10s} {line[2]:>18s} {line[3]:>9s} {line[4]:>7s}  "
                  f"{line[5]:30s} {line[6]}")
    print()
    for recipe in sorted({r.recipe for r in table}):
        torchao = [r for r in table if r.recipe == recipe and not r.other_engine]
        errors = [r.error for r in torchao if r.error is not None]
        if errors:
            mean_abs, mean = statistics.mean(abs(e) for e in errors), statistics.mean(errors)
            print(f"{recipe}: {len(errors)} torchao runs, mean |error| {mean_abs:.1%}, mean error "
                  f"{mean:+.1%}, within 15%: {sum(abs(e) <= 0.15 for e in errors)} of {len(errors)}")
        capped = [r.speedup_error for r in torchao if r.error is None and r.speedup_error is not None]
        if capped:
            print(f"{recipe}: {len(capped)} torchao runs on cards of unstated power cap, speed-up over bf16 "
                  f"within 15%: {sum(abs(e) <= 0.15 for e in capped)} of {len(capped)} (errors "
                  f"{', '.join(f'{e:+.1%}' for e in capped)})")
    memory = [r for r in table if r.memory_error is not None and not r.other_engine]
    if memory:
        errors = [r.memory_error for r in memory if r.memory_error is not None]
        print(f"memory: {len(errors)} torchao runs publish a peak, mean |error| "
              f"{statistics.mean(abs(e) for e in errors):.1%}, within 15%: "
              f"{sum(abs(e) <= 0.15 for e in errors)} of {len(errors)}, above the stated margin: "
              f"{sum(r.exceeds_margin for r in memory)}")


if __name__ == "__main__":
    main()
