"""Published mixture-of-experts runs in the fidelity corpus: how their routing is priced, and how the
report keeps them apart (issue 40 item 5)."""

from __future__ import annotations

import pytest

from planner.cost.parameters import CORPUS_FIT
from planner.fidelity import intervals
from planner.fidelity.fit import Prices, SourceRun
from planner.fidelity.pricing import price_run
from planner.fidelity.report import FidelityReport, stored_report
from planner.fidelity.schema import Run, load_corpus
from planner.fidelity.split import split_of
from planner.uncertainty import EXPERT_FAMILY, dimension_family, dimension_key

MOE_GUARD = {"throughput_mean": 0.23, "throughput_max": 3.4, "memory_mean": 0.04}
"""Today's mixture-of-experts errors rounded up (throughput: mean 22.3% over 68 runs from 13 sources, max
+334%; memory: mean 3.7% over 28 runs from 5 sources). Issue 40 asks for 15% and 12%. (2026-11-29:
torchtitan's own MoE runs joined, priced faster than they ran, which took the mean to 28.8%; grouped
GEMMs at torch._grouped_mm's measured share of the dense rate (GROUPED_MM_EFFICIENCY) brought it to
17.1% over 27 runs. Then four sources joined (Megatron-Bridge 26.02.01/26.04/26.06, Lambda's torchtitan
sweeps on 8 B200 and 64 GB300, a torchtitan fork's Qwen3 experiments on 8 H200): 33.2% over 71 runs;
chips no fit measured took their GEMM share from their power density (29.6%), a rank's grouped GEMMs its
experts' summed load, and speeds measured while the allocator thrashed left the comparison (the source's
words): 22.3%. The max is the fork's 'naive' Qwen3 baseline at tp 4, ep 2, 2.34% MFU.)"""


def _moe_runs() -> list[tuple[str, Run]]:
    return [(f.source.id, run) for f in load_corpus() for run in f.runs if run.config.experts is not None]


@pytest.fixture(scope="module")
def report() -> FidelityReport:
    return stored_report()


def test_the_corpus_has_published_moe_runs_from_several_sources_all_held_out() -> None:
    priced = [(source, run) for source, run in _moe_runs() if run.priceable]
    assert len(priced) >= 12 and len({source for source, _ in priced}) >= 3
    assert all(split_of(source) == "held-out" for source, _ in priced)


def test_moe_runs_without_expert_parallelism_calibrate_the_expert_family_not_the_dense_one() -> None:
    # FSDP alone shards these experts, but their routed GEMMs err as the expert-parallel runs' do: their
    # residuals join the expert family, so that they neither widen nor narrow a dense plan's interval.
    fsdp_only = [(s, r) for s, r in _moe_runs() if r.priceable and r.config.mesh.ep == 1]
    assert fsdp_only
    source, run = fsdp_only[0]
    scored = intervals.residuals([(SourceRun(source, run), price_run(run))], fit=CORPUS_FIT, prices=Prices(),
                                 split="held-out")
    (residual,) = scored["throughput"]
    assert residual.dims == "experts" and dimension_family(residual.dims) == EXPERT_FAMILY
    assert dimension_key(run.config.mesh) == "dp" and dimension_family("dp") == "*"


def test_a_run_whose_source_contradicts_its_layout_is_reported_unpriced_with_the_reason(
    report: FidelityReport,
) -> None:
    # Megatron-Bridge 25.11's B200 row: its table says EP 8, its recipe 64, and its speed is EP 64's.
    source, run = "megatron-bridge-performance-summary-25-11", "gpt-oss-120b-b200-64gpu-ep8-bf16"
    (row,) = [r for r in report.runs if (r.source, r.run_id) == (source, run)]
    assert row.moe and not row.priced and row.reason is not None and "EP 8" in row.reason


def test_a_forced_contiguous_gate_with_deepep_is_priced_as_deduplicated_balanced_dispatch() -> None:
    run = next(r for _, r in _moe_runs() if r.id == "deepseek-v3-h100-256gpu-pp4-ep64")
    routing = run.config.experts
    assert routing is not None and (routing.dispatcher, routing.gate) == ("deepep", "forced_contiguous")
    priced = price_run(run)
    learned = run.model_copy(update={"config": run.config.model_copy(update={"experts": None})})
    as_torchtitan = price_run(learned)
    # Each token's 8 experts sit on 2 ranks of one node: one copy crosses the network, not 8.
    assert priced.predicted_tokens_per_s_per_gpu > 1.5 * as_torchtitan.predicted_tokens_per_s_per_gpu
    exposed = priced.plan.prediction.exposed_expert_parallel_s
    assert 0 < exposed < as_torchtitan.plan.prediction.exposed_expert_parallel_s


def test_moe_runs_are_reported_apart_with_their_own_targets(report: FidelityReport) -> None:
    moe = [r for r in report.runs if r.moe and r.priced]
    assert moe and all(r.split == "held-out" for r in moe)
    held_out_runs = sum(s.runs for s in report.held_out_by_quantity if s.quantity == "throughput")
    dense = [r for r in report.runs if r.priced and r.split == "held-out" and not r.moe]
    assert held_out_runs == sum(r.throughput_error is not None for r in dense)
    assert {s.group for s in report.moe_by_source} == {r.source for r in moe}
    names = [t.name for t in report.targets if t.name.startswith("MoE:")]
    assert any("priced runs" in n for n in names) and any("throughput mean" in n for n in names)


def test_no_moe_error_regresses_past_the_guard(report: FidelityReport) -> None:
    (total,) = [s for s in report.moe_by_quantity if s.quantity == "throughput"]
    assert total.mean_abs <= MOE_GUARD["throughput_mean"], f"MoE throughput mean {total.mean_abs:.1%}"
    assert total.max_abs <= MOE_GUARD["throughput_max"], f"MoE throughput max {total.max_abs:.1%}"
    for memory in [s for s in report.moe_by_quantity if s.quantity == "memory"]:
        assert memory.mean_abs <= MOE_GUARD["memory_mean"], f"MoE memory mean {memory.mean_abs:.1%}"
