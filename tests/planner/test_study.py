"""What-if studies (planner/study.py): the arithmetic, the Pareto front, the picks, the candidates, and
the refusals of bad inputs."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from planner.catalog.gpus import GPU_CATALOG
from planner.catalog.models import resolve_model
from planner.errors import InfeasiblePlanError
from planner.gpu_spec import GpuSpec
from planner.search import make_plan
from planner.study import (
    DEFAULT_PRICES_PER_GPU_HOUR,
    StudyPoint,
    StudyRequest,
    pareto_front,
    parse_cluster_sizes,
    parse_token_count,
    refused_point,
    study_point,
    summarize,
    training_cost,
)

CUSTOM = {"name": "MI300X-like", "memory_gib": 190.0, "peak_bf16_tflops": 1300.0, "peak_fp32_tflops": 160.0,
          "memory_bandwidth_gbps": 5300.0, "intra_node_bandwidth_gbps": 448.0,
          "inter_node_bandwidth_gbps": 50.0}


def study(**overrides: Any) -> StudyRequest:
    fields: dict[str, Any] = {
        "model": resolve_model("llama3-8b"), "token_budget": 10**12,
        "gpus": [{"gpu": "H100"}, {"gpu": "A100", "price_per_gpu_hour": 1.5}],
        "cluster_sizes": [8, 16, 64], "seq_len": 4096, "global_batch_tokens": 4 * 2**20,
    }
    return StudyRequest.model_validate({**fields, **overrides})


def point(days: float, cost: float, **fields: Any) -> StudyPoint:
    base = {"gpu": "H100-SXM-80GB", "num_gpus": 8, "num_nodes": 1, "gpus_per_node": 8,
            "global_batch_tokens": 1024, "price_per_gpu_hour": 1.0, "fits": True}
    return StudyPoint(**{**base, "days": days, "cost": cost, **fields})


def test_days_gpu_hours_and_cost_by_hand() -> None:
    # 1.2T tokens at 2,000,000 tokens/s is 600,000 s = 6.944 days = 166.67 h; on 64 GPUs that is
    # 10,666.67 GPU-hours, at $2.50 per GPU-hour $26,666.67.
    spent = training_cost(token_budget=1_200_000_000_000, tokens_per_s=2_000_000.0, num_gpus=64,
                          price_per_gpu_hour=2.5)
    assert spent.seconds == 600_000.0
    assert spent.days == pytest.approx(600_000 / 86_400, rel=1e-15)
    assert spent.gpu_hours == pytest.approx(64 * 600_000 / 3600, rel=1e-15)
    assert spent.cost == pytest.approx(26_666.666_666_666_67, rel=1e-12)


def test_a_point_follows_from_its_plans_predicted_throughput_and_the_price_exactly() -> None:
    request = study(cluster_sizes=[8], gpus=[{"gpu": "H100", "price_per_gpu_hour": 2.0}])
    (candidate,) = request.candidates()
    assert candidate.request is not None
    plan = make_plan(candidate.request)
    result = study_point(request, candidate, plan)
    tokens_per_s = plan.prediction.tokens_per_s
    assert result.fits and result.plan_hash == plan.plan_hash
    assert result.tokens_per_s == tokens_per_s
    assert result.days == 10**12 / tokens_per_s / 86_400
    assert result.gpu_hours == 8 * (10**12 / tokens_per_s) / 3600
    assert result.cost == result.gpu_hours * 2.0
    assert result.config_label == plan.config.label()
    assert result.peak_memory_gib == plan.prediction.peak_memory_gib


def test_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    points = [(10.0, 100.0), (5.0, 200.0), (20.0, 90.0), (10.0, 150.0), (30.0, 300.0), (5.0, 200.0)]
    assert pareto_front(points) == [0, 1, 2, 5]  # (10,150) and (30,300) are beaten; twins both stay
    assert pareto_front([]) == []


def test_summarize_marks_front_deadline_and_picks() -> None:
    points = [point(100.0, 50.0), point(40.0, 80.0), point(10.0, 200.0), point(50.0, 90.0),
              point(1.0, 1.0, fits=False, reason="out of memory")]
    summary = summarize(points, deadline_days=45.0)
    assert [p.pareto for p in summary.points] == [True, True, True, False, False]
    assert [p.within_deadline for p in summary.points] == [False, True, True, False, None]
    assert (summary.fastest, summary.cheapest, summary.cheapest_within_deadline) == (2, 0, 1)
    assert summarize(points, deadline_days=None).cheapest_within_deadline is None
    assert summarize(points, deadline_days=0.5).cheapest_within_deadline is None  # none in time
    assert summarize([], deadline_days=3.0).fastest is None


def test_candidates_cover_types_by_sizes_and_refuse_partial_nodes() -> None:
    request = study(cluster_sizes=[4, 8, 12, 16])
    labels = [(c.gpu, c.num_gpus, c.label, c.refusal is None) for c in request.candidates()]
    assert labels[:4] == [
        ("H100-SXM-80GB", 4, "1x4xH100-SXM-80GB", True),  # less than a node: one smaller node
        ("H100-SXM-80GB", 8, "1x8xH100-SXM-80GB", True),
        ("H100-SXM-80GB", 12, "12xH100-SXM-80GB", False),
        ("H100-SXM-80GB", 16, "2x8xH100-SXM-80GB", True),
    ]
    refused = refused_point(request.candidates()[2])
    assert not refused.fits and refused.reason == "12 GPUs is not a whole number of 8-GPU H100-SXM-80GB nodes"
    assert [c.price_per_gpu_hour for c in request.candidates()[::4]] == [
        DEFAULT_PRICES_PER_GPU_HOUR["H100-SXM-80GB"], 1.5]


def test_every_catalog_gpu_has_a_default_price() -> None:
    """A study may name any catalog GPU without a price (a custom GPU needs one)."""
    assert set(DEFAULT_PRICES_PER_GPU_HOUR) == set(GPU_CATALOG)
    point = study(gpus=[{"gpu": "H100-96GB"}], cluster_sizes=[8]).candidates()[0]
    assert point.price_per_gpu_hour == DEFAULT_PRICES_PER_GPU_HOUR["H100-SXM-96GB"]


def test_size_ranges_and_batch_rules() -> None:
    assert study(cluster_sizes={"min_gpus": 8, "max_gpus": 100}).sizes() == [8, 16, 32, 64]
    stepped = study(cluster_sizes={"min_gpus": 16, "max_gpus": 64, "progression": "step", "step": 16})
    assert stepped.sizes() == [16, 32, 48, 64]
    assert study(cluster_sizes=[64, 8, 8]).sizes() == [8, 64]
    weak = study(global_batch_tokens=None, batch_rule="per_gpu", batch_tokens_per_gpu=8192)
    assert [c.global_batch_tokens for c in weak.candidates()[:3]] == [8 * 8192, 16 * 8192, 64 * 8192]


def test_an_infeasible_cluster_is_a_point_with_the_reason() -> None:
    request = study(model=resolve_model("llama3-70b"), cluster_sizes=[8], gpus=[{"gpu": "L4"}])
    (candidate,) = request.candidates()
    assert candidate.request is not None
    with pytest.raises(InfeasiblePlanError) as error:
        make_plan(candidate.request)
    refused = refused_point(candidate, error.value)
    assert not refused.fits and refused.cost is None
    assert refused.reason is not None
    assert refused.reason.startswith("out of memory: the lightest configuration")


def test_a_gpu_type_of_ones_own_is_planned_from_its_datasheet() -> None:
    request = study(gpus=[{"gpu": CUSTOM["name"], "custom_gpu": CUSTOM, "price_per_gpu_hour": 2.2}],
                    cluster_sizes=[8])
    (candidate,) = request.candidates()
    assert candidate.request is not None
    plan = make_plan(candidate.request)
    assert plan.cluster.gpu == "MI300X-like" and plan.cluster.gpu_spec == GpuSpec(**CUSTOM)
    assert plan.prediction.usable_memory_gib is not None and plan.prediction.usable_memory_gib > 150
    # The custom GPU travels with the request: plans hash it, so a changed datasheet is another plan.
    faster = study(gpus=[{"gpu": CUSTOM["name"], "custom_gpu": {**CUSTOM, "peak_bf16_tflops": 2000.0},
                          "price_per_gpu_hour": 2.2}], cluster_sizes=[8]).candidates()[0]
    assert faster.request is not None
    assert make_plan(faster.request).plan_hash != plan.plan_hash


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"gpus": []}, "gpus", "at least 1"),
    ({"gpus": [{"gpu": "H100", "price_per_gpu_hour": 0}]}, "price_per_gpu_hour", "greater than 0"),
    ({"gpus": [{"gpu": "H100", "price_per_gpu_hour": -3.0}]}, "price_per_gpu_hour", "greater than 0"),
    ({"gpus": [{"gpu": "H100", "price_per_gpu_hour": math.inf}]}, "price_per_gpu_hour", "finite"),
    ({"gpus": [{"gpu": "MI300X-like", "custom_gpu": CUSTOM}]}, "", "no default price"),
    ({"gpus": [{"gpu": "H100"}, {"gpu": "H100-SXM-80GB"}]}, "", "each GPU type once"),
    ({"token_budget": 10**17}, "token_budget", "less than or equal"),
    ({"token_budget": 0}, "token_budget", "greater than or equal"),
    ({"cluster_sizes": []}, "cluster_sizes", "at least 1"),
    ({"cluster_sizes": {"min_gpus": 64, "max_gpus": 8}}, "cluster_sizes", "is empty"),
    ({"cluster_sizes": {"min_gpus": 1, "max_gpus": 2**18, "progression": "step"}}, "", "more than the 256"),
    ({"global_batch_tokens": 1000}, "", "not a whole number of 4096-token sequences"),
    ({"batch_rule": "per_gpu"}, "", "batch_tokens_per_gpu: the 'per_gpu' batch rule needs it"),
    ({"deadline_days": 0}, "deadline_days", "greater than 0"),
])
def test_bad_inputs_are_refused_with_the_field_and_the_fix(overrides: dict[str, Any], field: str,
                                                            words: str) -> None:
    with pytest.raises(ValidationError) as error:
        study(**overrides)
    text = str(error.value)
    assert words in text, text
    assert field in text


def test_token_counts_and_size_texts() -> None:
    assert parse_token_count("15T") == 15 * 10**12
    assert parse_token_count("2.5b") == 2_500_000_000
    assert parse_token_count("1e9") == 10**9
    assert parse_token_count("1_000") == 1000
    for bad in ("lots", "0", "-5", "inf", "1e400"):
        with pytest.raises(ValueError, match="token count"):
            parse_token_count(bad)
    assert parse_cluster_sizes("8-4096") == {"min_gpus": 8, "max_gpus": 4096}
    assert parse_cluster_sizes("64-512:+64") == {"min_gpus": 64, "max_gpus": 512, "progression": "step",
                                                 "step": 64}
    assert parse_cluster_sizes("64, 128") == [64, 128]
    for bad in ("", "8-", "a,b", "8..16"):
        with pytest.raises(ValueError, match="cannot read"):
            parse_cluster_sizes(bad)


@pytest.mark.parametrize("text", ["\u00b2", "\u0663,\u0664", "8-\u0664", "\u0663-64:+8", "1\u00b2", "\uff18"])
def test_cluster_sizes_in_other_scripts_digits_are_refused(text: str) -> None:
    # issue 22: '²'.isdigit() is true (int() then failed: "invalid literal for int()"), and `\d` read the
    # Arabic-Indic '٣,٤' as [3, 4]. Only ASCII digits, as in the cluster text.
    with pytest.raises(ValueError, match=r"cannot read .*; write a list .* in ASCII digits"):
        parse_cluster_sizes(text)


@pytest.mark.parametrize("text", ["\u00b2", "\u0663", "\u0663T", "1\u00b2B", "\u0663e9"])
def test_token_counts_in_other_scripts_digits_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"cannot read .* as a token count"):
        parse_token_count(text)
