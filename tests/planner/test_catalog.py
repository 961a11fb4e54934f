"""Catalog models against their published parameter counts and FLOPs per token."""

from __future__ import annotations

import pytest

from planner.catalog.gpus import GPU_CATALOG, gpu_for_device, resolve_gpu
from planner.catalog.models import MODEL_CATALOG, resolve_model
from planner.cost.model_costs import count_parameters, model_costs
from planner.errors import UnknownCatalogEntryError

# Published totals (model cards / papers).
PUBLISHED_PARAMS = {
    "llama2-7b": 6.74e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3.1-405b": 405.9e9,
    "mistral-7b": 7.24e9,
    "gpt2": 124.4e6,
    "gpt2-medium": 354.8e6,
    "gpt2-large": 774.0e6,
    "gpt2-xl": 1557.6e6,
}


@pytest.mark.parametrize(("name", "published"), PUBLISHED_PARAMS.items())
def test_parameter_counts_match_published_within_half_a_percent(name: str, published: float) -> None:
    counted = count_parameters(MODEL_CATALOG[name])
    assert abs(counted - published) / published < 0.005, f"{name}: {counted:,} vs {published:,.0f}"


def test_llama_debug_is_a_few_million_parameters() -> None:
    assert 1e6 < count_parameters(MODEL_CATALOG["llama-debug"]) < 10e6


def test_flops_per_token_follow_6n_plus_12lhqt() -> None:
    # Llama 3 8B at seq 8192: N excludes the 525M-parameter input embedding, keeps the head.
    costs = model_costs(MODEL_CATALOG["llama3-8b"], 8192)
    n = 8_030_261_248 - 128256 * 4096
    expected = 6 * n + 12 * 32 * 32 * 128 * 8192
    assert costs.flops_per_token == pytest.approx(expected, rel=1e-9)
    assert costs.flops_per_token == pytest.approx(57.9e9, rel=0.01)


def test_gpt2_flops_match_nanogpt_convention() -> None:
    # nanoGPT: N = all params minus position embeddings (the tied head counts), 6N + 12LHQT at 1024.
    costs = model_costs(MODEL_CATALOG["gpt2"], 1024)
    n = 124_439_808 - 1024 * 768
    assert costs.flops_per_token == pytest.approx(6 * n + 12 * 12 * 12 * 64 * 1024, rel=1e-9)


def test_gpu_aliases_resolve_case_insensitively() -> None:
    assert resolve_gpu("h100").name == "H100-SXM-80GB"
    assert resolve_gpu("A100").name == "A100-80GB"
    assert {"H100-SXM-80GB", "H200-141GB", "A100-80GB", "A100-40GB", "L4", "B200", "cpu"} <= set(GPU_CATALOG)
    assert all(g.peak_bf16_tflops > 0 and g.memory_gib > 0 for g in GPU_CATALOG.values())


def test_unknown_names_list_what_is_known() -> None:
    with pytest.raises(UnknownCatalogEntryError, match=r"unknown GPU 'V9000'.*H100-SXM-80GB"):
        resolve_gpu("V9000")
    with pytest.raises(UnknownCatalogEntryError, match=r"unknown model 'llama9'.*llama3-8b"):
        resolve_model("llama9")


@pytest.mark.parametrize(
    ("device_name", "gpu"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100 PCIe", "A100-80GB"),  # no size written: the family's first entry
        ("NVIDIA L4", "L4"),
        ("NVIDIA B200", "B200"),
        ("cpu (x86_64)", "cpu"),
        ("NVIDIA L40S", "L40S"),  # a word, not a prefix: an L40S is no L4
        ("NVIDIA L40", None),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA GB300", "GB300"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA H800", "H800"),
        ("NVIDIA H20", "H20"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA GH200 480GB", None),
        ("TPU v5e", None),
        ("", None),
    ],
)
def test_a_device_name_finds_its_catalog_gpu(device_name: str, gpu: str | None) -> None:
    found = gpu_for_device(device_name)
    assert (found.name if found else None) == gpu
