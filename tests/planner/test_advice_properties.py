"""One source of advice (planner/infeasibility.py `advise`): every suggestion plans, and no smaller
one would.

A suggestion is a batch that rounds the one asked for to a whole split over the data-parallel ranks
(world / tp) of a searched tensor-parallel degree, on the requested cluster or on the smallest one
that plans such a batch. Here every suggestion is planned with `make_plan`, every nearer rounding on
the same side is refused by it, and so is every rounding on one node fewer.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.catalog.models import resolve_model
from planner.enumeration import splitting_degrees
from planner.errors import InfeasiblePlanError, PlanningError
from planner.infeasibility import Advice, Prober, advise, roundings
from planner.precheck import read_request
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpace, TrainingSpec


def on(request: PlanRequest, nodes: int, sequences: int) -> PlanRequest:
    """The request on `nodes` nodes with a batch of `sequences`, validated as a user's request is."""
    data = request.model_dump()
    data["cluster"]["num_nodes"] = nodes
    data["training"]["global_batch_tokens"] = sequences * request.training.seq_len
    return PlanRequest.model_validate(data)


def plans(request: PlanRequest) -> bool:
    """Whether the search finds a configuration that fits (a batch that splits: else it raises)."""
    try:
        make_plan(request)
    except InfeasiblePlanError:
        return False
    return True


def advice_for(request: PlanRequest, tokens: int) -> Advice:
    return advise(Prober(request, build_setting(request)), tokens)


def side(request: PlanRequest, sequences: int, tokens: int) -> int:
    batch = sequences * request.training.seq_len
    return (batch > tokens) - (batch < tokens)


@st.composite
def asked(draw: st.DrawFn) -> tuple[PlanRequest, int]:
    """A Llama-shaped request, often too big for its cluster, and a batch in tokens as typed: whole
    sequences or not, splitting over the cluster or not. The request carries that batch rounded
    down to whole sequences (at least one), as the pre-check's refusal does."""
    heads = draw(st.sampled_from([16, 32, 64]))
    model = ModelSpec(
        name="random",
        architecture="llama",
        vocab_size=draw(st.sampled_from([32_000, 128_256])),
        hidden_size=heads * 128,
        num_layers=draw(st.integers(8, 80)),
        num_heads=heads,
        num_kv_heads=8,
        intermediate_size=heads * 128 * draw(st.sampled_from([3, 4])),
        max_seq_len=131072,
    )
    nodes, gpus = draw(st.integers(1, 3)), draw(st.sampled_from([2, 4, 8]))
    gpu = draw(st.sampled_from(["L4", "A100-40GB", "H100"]))
    seq_len = draw(st.sampled_from([2048, 8192, 32768]))
    tokens = seq_len * draw(st.integers(1, 4 * nodes * gpus)) + draw(st.sampled_from([0, 0, 1, seq_len // 2]))
    pins = draw(st.sampled_from([None, None, [1], [2, 8]]))
    search = SearchSpace() if pins is None or gpus < max(pins) else SearchSpace(tensor_parallel_degrees=pins)
    request = PlanRequest(
        model=model,
        cluster=ClusterSpec(num_nodes=nodes, gpus_per_node=gpus, gpu=gpu),
        training=TrainingSpec(seq_len=seq_len, global_batch_tokens=max(seq_len, tokens // seq_len * seq_len)),
        search=search,
    )
    return request, tokens


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(asked())
def test_every_suggestion_plans_and_no_smaller_one_would(drawn: tuple[PlanRequest, int]) -> None:
    request, tokens = drawn
    advice = advice_for(request, tokens)
    if not advice.batches:
        assert advice.largest_tried is not None and not advice.largest_tried.fits
        return
    nodes = advice.batches[0].num_nodes
    assert all(probe.num_nodes == nodes for probe in advice.batches)
    for probe in advice.batches:
        suggested = on(request, nodes, probe.global_batch_sequences)
        assert splitting_degrees(suggested), "a suggestion splits over some tp degree's data-parallel ranks"
        assert plans(suggested), f"{probe.global_batch_sequences} sequences on {nodes} nodes were refused"
        distance = abs(probe.global_batch_sequences * request.training.seq_len - tokens)
        nearer = [
            b for b in roundings(request, nodes, tokens)
            if abs(b * request.training.seq_len - tokens) < distance
            and side(request, b, tokens) in (0, side(request, probe.global_batch_sequences, tokens))
        ]
        for batch in nearer:
            assert not plans(on(request, nodes, batch)), f"{batch} sequences are nearer and plan"
    if nodes > request.cluster.num_nodes:
        for batch in roundings(request, nodes - 1, tokens):
            assert not plans(on(request, nodes - 1, batch)), f"{batch} sequences plan on {nodes - 1} nodes"
    if advice.same_batch is not None:
        assert tokens % request.training.seq_len == 0
        assert plans(on(request, advice.same_batch.num_nodes, tokens // request.training.seq_len))


def request_for(model: str, cluster: str, seq_len: int, tokens: int) -> PlanRequest:
    return read_request({
        "model": resolve_model(model),
        "cluster": ClusterSpec.parse(cluster),
        "training": {"seq_len": seq_len, "global_batch_tokens": tokens},
    })


def test_the_smallest_cluster_keeps_a_batch_that_splits_over_its_data_parallel_ranks() -> None:
    # Issue 24, item 3: 2 sequences of a million tokens split over 2 data-parallel ranks of tp=8 on
    # 2x8 GPUs; the advice asked for 16 sequences (one per GPU).
    request = request_for("llama3-8b", "1x8xH100", 1_000_000, 2_000_000)
    with pytest.raises(InfeasiblePlanError) as exc:
        make_plan(request)
    error = exc.value
    assert (error.min_fitting_nodes, error.suggested_global_batch_tokens) == (2, 2_000_000)
    assert error.min_fitting_nodes_same_batch == 2
    assert "Smallest cluster that fits: 2x8xH100-SXM-80GB (16 GPUs)." in error.message
    plan = make_plan(on(request, 2, 2))
    mesh = plan.config.mesh
    assert 2 % mesh.dp == 0 and mesh.dp * mesh.model_parallel == 16  # tp and/or cp split the sequence


def test_partial_sequences_are_rounded_to_the_nearest_batch_that_splits_over_data_parallel_ranks() -> None:
    # Issue 24, item 4: 100,000 tokens at seq 8192 on 8 GPUs; 12 sequences split over 4 ranks of tp=2.
    with pytest.raises(PlanningError) as exc:
        request_for("llama3-8b", "1x8xH100", 8192, 100_000)
    assert exc.value.field == "training.global_batch_tokens"
    assert "e.g. 12 sequences = 98304 tokens (split over 4 data-parallel ranks at tp=2) or 13 sequences" in (
        exc.value.message
    )
    assert "65536" not in exc.value.message
