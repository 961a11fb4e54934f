"""The memory margin a plan keeps follows the measured error of runs like it: the base margin, or the
wider one of its outermost parallel dimension (planner/cost/memory.py `memory_margin_for`,
planner/fidelity/fit.py `dimension_margins`)."""

from __future__ import annotations

import pytest

from contract.mesh import Mesh
from planner.cost.memory import margin_dimension, memory_limit_gib, memory_margin_for
from planner.cost.parameters import CORPUS_FIT
from planner.errors import PlanningError
from planner.fidelity.fit import corpus_runs
from planner.fidelity.pricing import price_as_run
from planner.fidelity.schema import load_corpus
from planner.search import build_setting, make_plan
from planner.specs import SearchSpace
from tests.planner.conftest import make_request

WIDER = {m.dimension: m for m in CORPUS_FIT.dimension_margins}


def test_a_plan_falls_under_its_outermost_parallel_dimension() -> None:
    assert margin_dimension(Mesh(dp_shard=8)) is None
    assert margin_dimension(Mesh(dp_shard=4, tp=2)) == "tp"
    assert margin_dimension(Mesh(dp_shard=2, cp=2, tp=2)) == "cp"
    assert margin_dimension(Mesh(pp=2, dp_shard=2, cp=2, tp=2)) == "pp"


def test_dimensions_whose_runs_were_under_predicted_more_keep_a_wider_margin() -> None:
    params = build_setting(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16)).params
    base = memory_margin_for(params, Mesh(dp_shard=8))
    assert base == (CORPUS_FIT.memory_margin, CORPUS_FIT.memory_margin_reason)
    assert {"pp", "tp"} <= WIDER.keys()
    for dimension, mesh in (("tp", Mesh(dp_shard=4, tp=2)), ("pp", Mesh(pp=2, dp_shard=2, tp=2))):
        margin, reason = memory_margin_for(params, mesh)
        assert margin == WIDER[dimension].margin > base[0]
        assert reason == WIDER[dimension].reason and "parallelism" in reason
        assert memory_limit_gib(params, 0.0, mesh) < memory_limit_gib(params, 0.0, Mesh(dp_shard=8))


@pytest.mark.parametrize(
    ("pins", "dimension"),
    [({"tensor_parallel_degrees": [1], "pipeline_parallel_degrees": [1]}, None),
     ({"tensor_parallel_degrees": [2], "pipeline_parallel_degrees": [1]}, "tp")],
)
def test_every_plan_states_the_margin_of_its_mesh(pins: dict, dimension: str | None) -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16, search=SearchSpace(**pins))
    prediction = make_plan(request).prediction
    expected = WIDER[dimension].margin if dimension else CORPUS_FIT.memory_margin
    assert prediction.memory_margin == expected
    # It fits with that margin: the search used the same limit.
    assert prediction.peak_memory_gib * (1 + expected) <= prediction.usable_memory_gib


def test_a_pipeline_plan_is_held_to_the_pipeline_margin() -> None:
    pinned = SearchSpace(pipeline_parallel_degrees=[4])
    request = make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=128, search=pinned)
    prediction = make_plan(request).prediction
    assert prediction.memory_margin == WIDER["pp"].margin
    assert prediction.peak_memory_gib * (1 + WIDER["pp"].margin) <= prediction.usable_memory_gib


def test_no_measured_peak_exceeds_its_prediction_plus_the_margin_the_planner_states() -> None:
    """Issue 21's guard over the whole corpus: every run with a measured peak that the planner can
    price at its configuration, Float8, pipelines and context parallelism included."""
    over, checked = [], 0
    for item in corpus_runs(load_corpus()):
        try:
            priced = price_as_run(item.run)
        except PlanningError:
            continue
        if priced.memory_error is None:
            continue
        checked += 1
        if priced.exceeds_margin:
            over.append((item.run.id, round(priced.memory_error, 3), priced.margin))
    assert checked > 30
    assert not over, over
