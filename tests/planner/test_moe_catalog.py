"""The mixture-of-experts catalog (and dense Qwen3) against the parameter counts their makers publish.

Each count is the model card's (or the release post's), quoted below. Where a card gives three
significant digits or more the count here is within 1% of it; where it gives two (37B, 3.3B, 32B, 17B) it
is within one unit of the last one, the card's own rounding. Conventions differ: OpenAI's gpt-oss card
counts the active parameters without the input embedding (its table: embedding and unembedding apart),
and so does DeepSeek-V2-Lite's 2.4B, the others with every weight a token uses.
"""

from __future__ import annotations

import pytest

from planner.catalog.models import catalog_model
from planner.cost.model_costs import model_costs

PUBLISHED: dict[str, tuple[float, float, str]] = {
    # name: (total, active, where from)
    "qwen3-8b": (8.2e9, 8.2e9, "Qwen/Qwen3-8B card: Number of Parameters 8.2B (dense)"),
    "mixtral-8x7b": (46.7e9, 12.9e9, "Mistral AI, Mixtral of experts: 46.7B total, 12.9B per token"),
    "mixtral-8x22b": (141e9, 39e9, "Mistral AI, Cheaper, Better, Faster, Stronger: 141B, 39B active"),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "Qwen/Qwen3-30B-A3B card: 30.5B in total and 3.3B activated"),
    "qwen3-235b-a22b": (235e9, 22e9, "Qwen/Qwen3-235B-A22B card: 235B in total and 22B activated"),
    "deepseek-v3": (671e9, 37e9, "DeepSeek-V3 card: 671B total (main model, MTP apart), 37B activated"),
    "deepseek-v2-lite": (15.7e9, 2.4e9, "DeepSeek-V2 paper, appendix: V2-Lite 15.7B total, 2.4B activated"),
    "kimi-k2": (1e12, 32e9, "moonshotai/Kimi-K2-Instruct card: 1T total, 32B activated"),
    "gpt-oss-20b": (20.91e9, 3.61e9, "OpenAI gpt-oss model card, table 1: 20.91B total, 3.61B active"),
    "gpt-oss-120b": (116.83e9, 5.13e9, "OpenAI gpt-oss model card, table 1: 116.83B total, 5.13B active"),
    "llama4-maverick": (400e9, 17e9, "meta-llama/Llama-4-Maverick-17B-128E card: 400B total, 17B active"),
}

TWO_DIGITS = {
    "deepseek-v3": 1e9, "deepseek-v2-lite": 0.1e9, "qwen3-30b-a3b": 0.1e9, "kimi-k2": 1e9,
    "llama4-maverick": 1e9,
}
"""Active counts the cards give to two significant digits: checked within one unit of the last."""
ROUNDED_TOTALS = {"kimi-k2": 0.05e12}
"""Totals the cards round further: Kimi K2's "1T" (it is DeepSeek-V3's architecture, whose 671B the
same code counts to 0.01%, with 384 experts and 64 heads), checked within half a tenth of it."""

EMBEDDING_APART = {"gpt-oss-20b", "gpt-oss-120b", "deepseek-v2-lite"}
"""Cards whose active count leaves the input embedding out (DeepSeek-V2-Lite's 2.4B: 2.45B without its
0.21B input embedding, 2.66B with it; DeepSeek-V3's 37B reads either way at its two digits)."""


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_total_and_active_counts(name: str) -> None:
    total, active, _ = PUBLISHED[name]
    costs = model_costs(catalog_model(name), 4096)
    ours_active = costs.active_params or costs.num_params
    if name in EMBEDDING_APART:
        ours_active -= costs.num_params_embedding
    assert abs(costs.num_params - total) <= max(0.01 * total, ROUNDED_TOTALS.get(name, 0.0))
    assert abs(ours_active - active) <= max(0.01 * active, TWO_DIGITS.get(name, 0.0))


def test_llama4_scout_counts_its_text_model() -> None:
    # meta-llama/Llama-4-Scout-17B-16E card: 109B total, 17B active, for the whole multimodal checkpoint;
    # the planner prices the text model, about 1.2B (the vision encoder and projector) less.
    costs = model_costs(catalog_model("llama4-scout"), 4096)
    assert 107e9 < costs.num_params < 109e9
    assert abs((costs.active_params or 0) - 17e9) <= 0.02 * 17e9


def test_mfu_counts_active_parameters() -> None:
    # 6 x the active parameters (but the input embedding) per token, plus attention: not 6 x the total.
    costs = model_costs(catalog_model("deepseek-v3"), 4096)
    assert costs.active_params is not None
    assert costs.flops_params == costs.active_params - costs.num_params_embedding
    assert costs.flops_per_token < 0.1 * 6.0 * costs.num_params


def test_dense_models_have_no_active_count() -> None:
    costs = model_costs(catalog_model("llama3-8b"), 4096)
    assert costs.active_params is None
    assert all(b.routed_experts == 0 for b in costs.blocks)
