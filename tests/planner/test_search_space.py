"""The search space is counted before it is searched (issue 38, item 6): `space_size` bounds what the
enumeration yields (exactly, without pipelines), every default search of any cluster a request may
name is admitted, and a larger one is refused before anything is priced."""

from __future__ import annotations

from typing import Any

import pytest

from planner.catalog.models import MODEL_CATALOG
from planner.enumeration import MAX_SEARCH_SPACE, check_space, enumerate_choices, space_size
from planner.errors import SearchSpaceError
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, PlanRequest


def request(model: str, cluster: str, seq_len: int, tokens: int, **search: Any) -> PlanRequest:
    return PlanRequest.model_validate({
        "model": MODEL_CATALOG[model], "cluster": ClusterSpec.parse(cluster),
        "training": {"seq_len": seq_len, "global_batch_tokens": tokens}, "search": search,
    })


@pytest.mark.parametrize(
    ("args", "pipelined"),
    [
        (("llama-debug", "1x2xcpu", 256, 1024), False),
        (("llama3-8b", "1x8xH100", 8192, 8192 * 64), False),
        (("gpt2", "1x8xA100", 1024, 1024 * 64), False),
        (("llama-debug", "2x2xcpu", 256, 4096), True),
        (("gpt2", "2x4xA100", 1024, 1024 * 64), True),
        (("llama3-70b", "8x8xH100", 8192, 8192 * 512), True),
    ],
)
def test_the_count_bounds_the_enumeration(args: tuple[str, str, int, int], pipelined: bool) -> None:
    planned = request(*args)
    enumerated = sum(1 for _ in enumerate_choices(planned, build_setting(planned, None, None)))
    counted = space_size(planned)
    # With pipelines a micro-batch no schedule runs is counted anyway: a bound.
    assert counted >= enumerated if pipelined else counted == enumerated


@pytest.mark.parametrize(
    "args",
    [
        ("llama2-7b", "4096x64xH100", 32768, 2**36),  # the largest default space found: about 1.1 million
        ("llama3-70b", "4096x64xH100", 32768, 2**36),
        ("llama3.1-405b", "4096x64xH100", 131072, 2**35),
        ("llama3.1-405b", "4096x8xH100", 1048576, 2**36),
    ],
)
def test_every_default_search_of_the_largest_clusters_is_admitted(args: tuple[str, str, int, int]) -> None:
    check_space(request(*args))  # does not raise


def test_a_space_past_the_limit_is_refused_before_anything_is_priced() -> None:
    too_large = request("llama2-7b", "4096x64xH100", 32768, 2**36, float8=["none", "tensorwise", "rowwise"])
    with pytest.raises(SearchSpaceError) as refused:
        make_plan(too_large, time_limit_s=600)  # refused at once: pricing it would take minutes
    assert refused.value.limit == MAX_SEARCH_SPACE and refused.value.configurations > MAX_SEARCH_SPACE
    assert refused.value.field == "search"


def test_counting_stops_past_the_limit() -> None:
    planned = request("llama3-70b", "8x8xH100", 8192, 8192 * 512)
    full = space_size(planned)
    assert 1000 < space_size(planned, limit=1000) <= full
