"""A search bounded in time, and planning errors that cross process borders (the service's pool)."""

from __future__ import annotations

import pickle

import pytest

from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError
from planner.search import make_plan
from tests.planner.conftest import make_request
from tests.planner.test_repeats import graph_request


def test_a_search_past_its_time_limit_stops_and_says_how_to_shrink_it() -> None:
    request = graph_request(200, "1x8xH100")
    with pytest.raises(SearchDeadlineError) as caught:
        make_plan(request, time_limit_s=0.0)
    error = caught.value
    assert error.field == "search" and error.time_limit_s == 0.0
    assert "the limit per plan" in error.message
    assert "merge the 202 layer-graph units into fewer, larger blocks" in error.message
    assert "search.shardings" in error.message


def test_a_generous_time_limit_changes_nothing() -> None:
    request = make_request("llama-debug", "1x2xcpu", seq_len=256, sequences=8)
    assert make_plan(request, time_limit_s=60.0) == make_plan(request)


@pytest.mark.parametrize(
    "error",
    [
        PlanningError("model: unknown", field="model"),
        InfeasiblePlanError("does not fit", min_fitting_nodes=4, min_peak_memory_gib=90.5, capacity_gib=70.2),
        SearchDeadlineError("search: stopped", time_limit_s=30.0, candidates_priced=812),
    ],
)
def test_planning_errors_survive_pickling(error: PlanningError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.__dict__ == error.__dict__
    assert str(copy) == str(error)
