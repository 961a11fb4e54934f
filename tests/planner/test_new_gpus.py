"""The catalog's 2026 accelerators (GB200, GB300, B300, H800, H20, L40S, MI300X, MI325X, MI355X): each
plans, and Float8 is offered where its tensor cores and torchao train it."""

from __future__ import annotations

import pytest

from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import MODEL_CATALOG
from planner.cost.gemm import sequence_scale
from planner.cost.model_costs import model_costs
from planner.enumeration import check_float8
from planner.errors import PlanningError
from planner.search import make_plan
from planner.specs import ClusterSpec
from tests.planner.conftest import make_request

NEW_GPUS = ("GB200", "GB300", "B300", "H800", "H20", "L40S", "MI300X", "MI325X", "MI355X")
MXFP8_GPUS = {"GB200", "GB300", "B300"}


@pytest.mark.parametrize("gpu", NEW_GPUS)
def test_llama3_8b_plans_on_each(gpu: str) -> None:
    spec = resolve_gpu(gpu)
    request = make_request("llama3-8b", f"1x{spec.default_gpus_per_node}x{gpu}", seq_len=4096, sequences=32)
    plan = make_plan(request)
    assert plan.prediction.tokens_per_s_per_gpu > 0
    assert plan.prediction.peak_memory_gib < spec.memory_gib


@pytest.mark.parametrize("gpu", NEW_GPUS)
def test_float8_recipes_each_trains(gpu: str) -> None:
    """Every new type has float8 tensor cores (tensorwise, rowwise); MXFP8 on Blackwell only."""
    request = make_request("llama3-8b", f"1x4x{gpu}", seq_len=4096, sequences=32)
    for recipe in ("tensorwise", "rowwise"):
        check_float8(request, recipe, field="search.float8")
    if gpu in MXFP8_GPUS:
        check_float8(request, "mxfp8", field="search.float8")
    else:
        with pytest.raises(PlanningError, match="MX tensor cores"):
            check_float8(request, "mxfp8", field="search.float8")


def test_published_figures_hold() -> None:
    """A few figures a typo would break: dense peaks (half the sparse ones vendors headline)."""
    assert resolve_gpu("GB200").peak_bf16_tflops == 2500 and resolve_gpu("GB200").peak_fp4_tflops == 10000
    mi300x = resolve_gpu("MI300X")
    assert mi300x.peak_fp8_tflops == pytest.approx(2 * mi300x.peak_bf16_tflops, abs=0.1)
    assert resolve_gpu("H800").intra_node_bandwidth_gbps < resolve_gpu("H100").intra_node_bandwidth_gbps
    assert resolve_gpu("L40S").peak_fp8_tflops == 733
    assert resolve_gpu("GB300").scaleup_domain_gpus == 72 and resolve_gpu("GB300").default_gpus_per_node == 4


@pytest.mark.parametrize("gpu", ["MI300X", "MI325X"])
def test_cdna3_attention_runs_at_the_primus_profiles_share_of_the_gemm_rate(gpu: str) -> None:
    """AMD's Primus deep dive profiles Llama 3.1 70B (seq 8192, full checkpointing) on torch's own
    flash op: aten::mm 67.43% of the step, its flash-attention forward and backward 7.48% + 19.47%.
    At the planner's FLOP counts for that step, attention runs at that share of the GEMMs' rate: of
    the catalog's GEMM ceiling (a kernel's figure, as every attention figure is)."""
    seq_len = 8192
    costs = model_costs(MODEL_CATALOG["llama3-70b"], seq_len)
    # Full checkpointing: every block's forward twice, backward 2x (GEMMs) and 2.5x (flash attention);
    # the output head outside the blocks once forward, 2x backward.
    matmul = sum(2.0 * block.matmul_params * 4 for block in costs.blocks) + 2.0 * costs.head.matmul_params * 3
    attention = sum(block.attention_flops * (1 + 1 + 2.5) for block in costs.blocks)
    rate_share = (attention / matmul) / ((7.48 + 19.47) / 67.43)
    assert rate_share == pytest.approx(0.218, abs=0.001)
    spec = resolve_gpu(gpu)
    expected = rate_share / sequence_scale(seq_len) * spec.matmul_efficiency
    assert spec.attention_efficiency == pytest.approx(expected, abs=0.001)


def test_a_custom_gpu_serialises_as_before() -> None:
    """The new figures are left out of a custom GPU that does not state them, so its request hashes
    as it did before they existed."""
    custom = resolve_gpu("H100").model_copy(update={"name": "H100-mine", "aliases": ()})
    cluster = ClusterSpec(gpu="H100-mine", custom_gpu=custom)
    dumped = cluster.model_dump(mode="json")["custom_gpu"]
    assert "peak_fp4_tflops" not in dumped and "scaleup_domain_gpus" not in dumped
