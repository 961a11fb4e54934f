"""Why the other families lost: reasons name only what the loser pays more of, each row is labelled
with its configuration's whole mesh, and no configuration is shown twice."""

from __future__ import annotations

import re

import pytest

import planner.search
from planner.cost.estimate import Estimator
from planner.plan import Plan, RejectedFamily
from planner.ranking import Evaluated
from planner.rejected_summary import summarize_rejected
from tests.planner.conftest import make_request

PLANS = [
    ("llama3-8b", "1x8xH100", 16),
    ("llama3-70b", "32x8xH100", 512),
    ("llama3.1-405b", "32x8xH100", 1024),
]


@pytest.fixture(scope="module", params=PLANS, ids=[p[0] for p in PLANS])
def planned(request: pytest.FixtureRequest) -> tuple[Plan, list[Evaluated], Evaluated, Estimator]:
    """A plan, with what its ranking saw: every priced configuration, the winner, the estimator."""
    model, cluster, sequences = request.param
    seen: dict = {}
    original = planner.search.rejected_families

    def spy(evaluated, best, limit, estimator):
        seen.update(evaluated=evaluated, best=best, estimator=estimator)
        return original(evaluated, best, limit, estimator)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner.search, "rejected_families", spy)
        plan = planner.search.make_plan(make_request(model, cluster, seq_len=8192, sequences=sequences))
    return plan, seen["evaluated"], seen["best"], seen["estimator"]


def _representative(r: RejectedFamily, evaluated: list[Evaluated]) -> Evaluated:
    """The fastest timed configuration the row's label names: the one its reason speaks for."""
    members = [e for e in evaluated if e.time is not None and e.choice.mesh_family == r.family]
    return max(members, key=lambda e: (e.tokens_per_s_per_gpu, -e.peak_gib))


def _component(e: Evaluated, name: str, estimator: Estimator) -> float:
    """The named cost of one configuration, in seconds per token its data-parallel rank handles."""
    t = e.time
    assert t is not None
    recompute_s, eager_s = estimator.compute_parts(e.choice)
    if name == "recomputation":
        seconds = recompute_s
    elif name == "unfused eager kernels":
        seconds = eager_s
    elif name == "compute":
        seconds = t.compute_s - recompute_s - eager_s - t.optimizer_s - t.overhead_s
    elif name == "optimizer step":
        seconds = t.optimizer_s
    elif name == "framework overhead":
        seconds = t.overhead_s
    elif name == "exposed all-gather":
        seconds = t.exposed_all_gather_s
    elif name in ("exposed reduce-scatter", "exposed all-reduce"):
        seconds = t.exposed_reduce_s
    elif re.fullmatch(r"tp=\d+ per-layer collectives", name):
        seconds = t.tensor_parallel_s
    elif name == "pipeline bubble":
        seconds = t.pipeline_bubble_s
    elif name == "pipeline sends":
        seconds = t.pipeline_p2p_s
    else:
        raise AssertionError(f"a reason names an unknown cost: {name!r}")
    return seconds * e.choice.mesh.model_parallel / e.choice.sequences_per_step


def test_reasons_name_only_costs_the_loser_pays_more_of(planned) -> None:
    plan, evaluated, best, estimator = planned
    slower = [r for r in plan.rejected if r.kind == "slower"]
    assert slower
    for r in slower:
        if r.reason.startswith("ties the chosen plan within 0.1%"):
            assert r.best_tokens_per_s_per_gpu >= 0.999 * plan.prediction.tokens_per_s_per_gpu
            continue
        head, _, causes = r.reason.partition(" slower: ")
        assert head.endswith("%") and causes, r.reason
        loser = _representative(r, evaluated)
        for cause in causes.split(" and "):
            name, _amount = re.fullmatch(r"(.+) \+(.+)/step", cause).groups()
            assert _component(loser, name, estimator) > _component(best, name, estimator) * 1.001, (
                r.family, r.reason
            )


def test_no_reason_invents_a_cause_for_a_tie(planned) -> None:
    plan, *_ = planned
    for r in plan.rejected:
        assert "0.0% slower" not in r.reason, (r.family, r.reason)


def test_a_reason_that_names_a_tp_degree_has_it_in_its_label(planned) -> None:
    plan, *_ = planned
    for r in plan.rejected:
        for tp in re.findall(r"tp=(\d+)", r.reason):
            assert f"tp{tp}" in r.family.split(), (r.family, r.reason)


def test_a_row_states_the_whole_mesh_of_the_configuration_it_stands_for(planned) -> None:
    plan, evaluated, *_ = planned
    for r in plan.rejected:
        if r.kind != "slower":
            continue
        mesh = _representative(r, evaluated).choice.mesh
        words = r.family.split()
        assert f"dp{mesh.dp_shard}x{mesh.dp_replicate}" in words and f"tp{mesh.tp}" in words, r.family
        assert (f"pp{mesh.pp}" in words) == (mesh.pp > 1) and (f"cp{mesh.cp}" in words) == (mesh.cp > 1)


def test_no_configuration_is_shown_twice(planned) -> None:
    """A sharding family and a model-parallel degree often stand for the same configuration (the
    fastest tp=4 one is the fastest no_shard one): one row, still one for every family that lost."""
    plan, evaluated, best, _ = planned
    shown = summarize_rejected(plan)
    for rows in (plan.rejected, shown.every_family):
        labels = [r.family for r in rows]
        assert len(labels) == len(set(labels)), sorted(label for label in labels if labels.count(label) > 1)
    configurations = [_representative(r, evaluated).choice for r in plan.rejected if r.kind == "slower"]
    assert len(configurations) == len(set(configurations))
    rows = {r.family for r in plan.rejected}
    for key in (lambda c: c.family, lambda c: c.tp_family):
        families: dict[str, set[str]] = {}
        for e in evaluated:
            families.setdefault(key(e.choice), set()).add(e.choice.mesh_family)
        if len(families) == 1:
            continue  # one searched (the degree when tp, cp and pp are pinned): none lost
        for family, labels in families.items():
            if family != key(best.choice):
                assert labels & rows, f"{family} lost but no row stands for it"
