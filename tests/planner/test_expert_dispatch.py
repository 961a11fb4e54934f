"""The expert-parallel all-to-alls' bytes (planner/cost/expert_dispatch.py) and the grouped GEMMs' waves."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.catalog.gpus import resolve_gpu
from planner.cost.expert_dispatch import destinations, dispatch_bytes_per_token
from planner.cost.gemm import tile_efficiency
from planner.cost.parameters import default_parameters
from planner.specs import ClusterSpec


def test_random_experts_reach_the_expected_number_of_ranks() -> None:
    # 8 of 256 experts over 64 ranks of 4: a rank is missed with probability C(252, 8) / C(256, 8).
    missed = math.comb(252, 8) / math.comb(256, 8)
    reached = destinations(experts=256, top_k=8, groups=64, placement="random")
    assert reached == pytest.approx(64 * (1 - missed))
    # One expert per token reaches one rank; every rank when k covers them all.
    assert destinations(experts=16, top_k=1, groups=8, placement="random") == pytest.approx(1.0)
    assert destinations(experts=8, top_k=8, groups=8, placement="random") == pytest.approx(8.0)


def test_contiguous_experts_reach_as_few_ranks_as_they_span() -> None:
    # NeMo AutoModel's balanced gate: token t takes experts t*k .. t*k + k - 1.
    assert destinations(experts=128, top_k=8, groups=8, placement="contiguous") == 1.0
    assert destinations(experts=256, top_k=8, groups=64, placement="contiguous") == 2.0
    assert destinations(experts=256, top_k=8, groups=8, placement="contiguous") == 1.0


def test_copies_send_top_k_rows_and_deduplication_one_per_destination() -> None:
    common = {"hidden": 7168, "act_bytes": 2, "experts": 256, "top_k": 8, "groups": 64, "placement": "random"}
    copies = dispatch_bytes_per_token(dispatch="copies", **common)
    deduplicated = dispatch_bytes_per_token(dispatch="deduplicated", **common)
    assert copies == 8 * 7168 * 2
    ranks = destinations(experts=256, top_k=8, groups=64, placement="random")
    assert deduplicated == pytest.approx(ranks * 7168 * 2)
    assert deduplicated < copies


def test_the_planners_own_dispatch_is_copies_from_a_learned_router() -> None:
    params = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")
    assert (params.expert_dispatch, params.expert_placement) == ("copies", "random")
    assert dataclasses.replace(params, expert_dispatch="deduplicated").expert_dispatch == "deduplicated"


def test_a_grouped_kernels_tiles_share_its_waves() -> None:
    # 16 experts of 256 x 768 outputs: alone each fills 16 of 132 SMs; together 256 tiles, two waves.
    alone = tile_efficiency(256, 768, 2048, 132)
    grouped = tile_efficiency(256, 768, 2048, 132, 16)
    assert grouped > alone
    assert tile_efficiency(256, 768, 2048, 132, 1) == alone
