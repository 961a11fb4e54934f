"""The search pauses CPython's cycle collector and leaves it as it found it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

import planner.precheck as precheck
import planner.search as search
from planner.collector import collector_paused
from planner.errors import InfeasiblePlanError
from tests.planner.conftest import make_request


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_paused_inside_and_resumed_after() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_resume_once_the_outermost_ends() -> None:
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_threads_resume_when_the_last_ends() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with collector_paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())  # the first search ended; this one still runs

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_make_plan_searches_with_the_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[bool] = []
    priced = search.Evaluated.priced

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        states.append(gc.isenabled())
        return priced(*args, **kwargs)

    monkeypatch.setattr(search.Evaluated, "priced", spy)
    search.make_plan(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16))
    assert states and not any(states)
    assert gc.isenabled()


def test_a_refused_search_resumes_the_collector() -> None:
    with pytest.raises(InfeasiblePlanError):
        search.make_plan(
            make_request("llama3.1-405b", "1x8xH100", seq_len=8192, sequences=8),
            advise_other_clusters=False,
        )
    assert gc.isenabled()


def test_a_batch_refusal_looks_for_advice_with_the_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[bool] = []
    what_plans = precheck._what_plans

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        states.append(gc.isenabled())
        return what_plans(*args, **kwargs)

    monkeypatch.setattr(precheck, "_what_plans", spy)
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=12)
    refusal = precheck.batch_refusal(request, 100_000)
    assert "98304" in refusal.message or "98,304" in refusal.message
    assert states == [False]
    assert gc.isenabled()
