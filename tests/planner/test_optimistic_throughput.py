"""Plans warned where published runs of their parallel dimension ran slower than priced: the evidence
is fitted from the corpus with the rest of `CORPUS_FIT` (tests/planner/test_corpus_fit.py checks it is
what the corpus gives), and a plan carries it when its mesh uses the dimension at the degree or more."""

from __future__ import annotations

from planner.cost.parameters import CORPUS_FIT
from planner.fidelity.fit import THROUGHPUT_TOLERANCE, _meshed, corpus_runs, dimension_throughput, fit_split
from planner.fidelity.schema import load_corpus
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import SearchSpace
from tests.planner.conftest import make_request


def _optimistic(plan: Plan) -> list[str]:
    return [w.message for w in plan.warnings if w.code == "optimistic_throughput"]


def test_the_evidence_is_the_corpus_runs_over_predicted_past_the_tolerance() -> None:
    runs = fit_split(corpus_runs(load_corpus()))
    evidence = {e.dimension: e for e in dimension_throughput(_meshed(runs, CORPUS_FIT))}
    # torchtitan's 8B at 128k and 256k tokens (cp 4 and 8) and its 405B pipelines of context-parallel
    # stages ran torch's ring attention 1.3-1.6x slower than priced; its 8B at tp 8 up to 1.33x.
    assert set(evidence) == {"cp", "tp"}
    assert evidence["cp"].degree == 2 and evidence["cp"].worst > 0.5
    assert evidence["tp"].degree == 8 and THROUGHPUT_TOLERANCE < evidence["tp"].worst < 0.5
    # Pipelines without context parallelism (torchtitan's 405B 1F1B and interleaved) are within 10%.
    assert "pp" not in evidence
    assert "up to 1.62x" in evidence["cp"].reason and "cp=2 or more" in evidence["cp"].reason


def test_a_context_parallel_plan_is_warned_and_a_data_parallel_one_is_not() -> None:
    long = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=131072, sequences=1))
    assert long.config.mesh.cp > 1
    (cp,) = [e for e in CORPUS_FIT.dimension_throughput if e.dimension == "cp"]
    assert _optimistic(long) == [cp.reason]

    short = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16,
                                   search=SearchSpace(tensor_parallel_degrees=[1])))
    assert short.config.mesh.cp == 1 and short.config.mesh.tp == 1
    assert _optimistic(short) == []


def test_tensor_parallelism_is_warned_from_the_degree_the_runs_were_over_predicted_at() -> None:
    (tp,) = [e for e in CORPUS_FIT.dimension_throughput if e.dimension == "tp"]
    below = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16,
                                   search=SearchSpace(tensor_parallel_degrees=[tp.degree // 2])))
    assert below.config.mesh.tp == tp.degree // 2 and _optimistic(below) == []
    at = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16,
                                search=SearchSpace(tensor_parallel_degrees=[tp.degree])))
    assert at.config.mesh.tp == tp.degree and _optimistic(at) == [tp.reason]
