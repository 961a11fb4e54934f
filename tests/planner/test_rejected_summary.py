"""The out-of-memory families of a large model fold into one line; nothing is lost (issue 24, item 6)."""

from __future__ import annotations

import re

import pytest

from planner.plan import Plan
from planner.rejected_summary import OOM_ROWS_SHOWN, summarize_rejected
from planner.search import make_plan
from tests.planner.conftest import make_request


@pytest.fixture(scope="module")
def plan_70b() -> Plan:
    """Llama 3 70B on 4 x 8 H100: every hybrid shard group and no_shard runs out of memory."""
    return make_plan(make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=128))


def test_the_oom_families_of_a_70b_plan_are_one_line_with_the_closest(plan_70b: Plan) -> None:
    oom = [r for r in plan_70b.rejected if r.kind == "oom"]
    assert len(oom) > OOM_ROWS_SHOWN
    summary = summarize_rejected(plan_70b)
    assert all(r.kind != "oom" for r in summary.shown) and summary.shown
    # Nothing is lost: the listed and the folded families are the plan's, each once.
    assert sorted(summary.every_family, key=repr) == sorted(plan_70b.rejected, key=repr)
    # Closest to fitting first: each family against its own limit (a mesh with tensor parallelism
    # keeps a wider margin than one without, so the limits differ).
    overshoots = [r.min_peak_memory_gib - r.memory_limit_gib for r in summary.folded]
    assert overshoots == sorted(overshoots)
    assert len({round(r.memory_limit_gib, 1) for r in summary.folded}) > 1
    closest = summary.folded[0]
    assert summary.line is not None
    assert summary.line.startswith(f"{len(oom)} more families do not fit: the closest, {closest.family}, ")
    # The overshoot is the planner's own ("OOM by 15.7 GiB").
    over = re.match(r"OOM by ([\d.]+) GiB", closest.reason)
    need = f"needs {closest.min_peak_memory_gib:.1f} GiB per GPU"
    assert over and f"{need}, {over[1]} GiB more than" in summary.line
    limit = closest.memory_limit_gib
    assert f"at most {limit:.1f} GiB fits" in closest.reason
    assert f"the {limit:.1f} GiB that fits with the memory margin" in summary.line


def test_a_few_oom_families_stay_listed_closest_to_fitting_first(plan_70b: Plan) -> None:
    slower = [r for r in plan_70b.rejected if r.kind != "oom"]
    oom = [r for r in plan_70b.rejected if r.kind == "oom"]
    closest_last = sorted(oom, key=lambda r: r.min_peak_memory_gib - r.memory_limit_gib)[:OOM_ROWS_SHOWN]
    closest_last.reverse()
    few = plan_70b.model_copy(update={"rejected": (*slower, *closest_last)})
    summary = summarize_rejected(few)
    assert summary.folded == () and summary.line is None
    # Those that fit and lost in the planner's order, then the out-of-memory ones closest first
    # (listed by name they read "OOM by 20.7 GiB" above "OOM by 5.2 GiB").
    assert summary.shown == (*slower, *closest_last[::-1])


def test_only_oom_families_say_no_more(plan_70b: Plan) -> None:
    oom = tuple(r for r in plan_70b.rejected if r.kind == "oom")
    summary = summarize_rejected(plan_70b.model_copy(update={"rejected": oom}))
    assert summary.shown == () and summary.line and summary.line.startswith(f"{len(oom)} families do not fit")
