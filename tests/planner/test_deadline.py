"""A search bounded in time, and planning errors that cross process borders (the service's pool)."""

from __future__ import annotations

import pickle

import pytest

from planner.errors import InfeasiblePlanError, PlanningError, SearchDeadlineError
from planner.precheck import BATCH_FIELD, PartialSequencesError, batch_refusal, read_request
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


def test_the_advice_of_a_batch_refusal_stops_at_the_time_limit() -> None:
    # 100 sequences split over none of 3x8 GPUs' data-parallel ranks: the refusal looks for batches that
    # plan (probing configurations) within the search's limit, and past it names the nearest that split.
    request = make_request("llama3-8b", "3x8xH100", seq_len=4096, sequences=100)
    with pytest.raises(PlanningError) as caught:
        make_plan(request, time_limit_s=0.0)
    message = caught.value.message
    assert not isinstance(caught.value, SearchDeadlineError) and caught.value.field == BATCH_FIELD
    assert message.startswith(f"{BATCH_FIELD}: 100 sequences of 4096 tokens cannot be split evenly over 24")
    assert message.endswith(
        "; the batches nearest it that split over 3x8xH100-SXM-80GB are 99, 102, 96, 108, 120 sequences, "
        "not checked for memory: looking for one that fits stopped after 0 s of CPU time, the limit per plan"
    )
    with pytest.raises(PlanningError) as generous:
        make_plan(request, time_limit_s=60.0)
    assert "use a batch that splits and fits on 3x8xH100-SXM-80GB" in generous.value.message


def test_a_batch_of_partial_sequences_can_be_refused_before_any_advice() -> None:
    whole = make_request("llama-debug", "1x2xcpu", seq_len=256, sequences=8)
    training = {"seq_len": 256, "global_batch_tokens": 2000}
    data = {"model": whole.model, "cluster": whole.cluster, "training": training}
    with pytest.raises(PartialSequencesError) as caught:
        read_request(data, advise=False)
    refused = pickle.loads(pickle.dumps(caught.value))  # as the service sends it to a search process
    assert refused.message == (
        f"{BATCH_FIELD}: 2000 is not a whole number of 256-token sequences (the batch must be a multiple of "
        "seq_len)"
    )
    assert refused.tokens == 2000 and refused.nearby.training.global_batch_tokens == 256 * 7
    with pytest.raises(PlanningError) as advised:
        read_request(data)
    assert advised.value.message == batch_refusal(refused.nearby, refused.tokens).message
    assert "use a batch that splits and fits on 1x2xcpu" in advised.value.message
