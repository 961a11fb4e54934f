"""Every number a plan shows carries its 80% interval (planner/plan_intervals.py over
planner/uncertainty.py): the pick, the alternatives, the Pareto front, the what-if rows and the CLI;
an assumed network widens the throughput's, a pick whose lead is inside it says so, and the corpus'
reach is named."""

from __future__ import annotations

import json
import math
import re
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from api.cli.main import app
from api.cli.plan_cmd import print_plan
from contract.mesh import Mesh
from contract.plan_document import SCHEMA_VERSION, parse_plan
from planner.catalog.models import resolve_model
from planner.cost.estimate import Estimator
from planner.cost.parameters import CostParameters
from planner.plan import Candidate, Plan, PlanWarning, RejectedFamily
from planner.plan_intervals import lead_within_interval
from planner.search import make_plan, predict
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from planner.study import StudyRequest, study_point
from planner.uncertainty import coverage_warnings, lead_uncertainty
from tests.older_schemas import as_schema_2_1
from tests.planner.conftest import make_request

runner = CliRunner()


def _intervals(plan: Plan) -> list[tuple[float, float, float, float, float, float]]:
    """(low, value, high) of throughput then memory, for the pick and every configuration beside it."""
    p = plan.prediction
    shown: list = [(p, p.tokens_per_s_per_gpu, p.peak_memory_gib)]
    beside = (*plan.alternatives, *plan.pareto_front)
    shown += [(c, c.tokens_per_s_per_gpu, c.peak_memory_gib) for c in beside]
    out = []
    for item, tokens, peak in shown:
        t, m = item.tokens_per_s_per_gpu_interval, item.peak_memory_gib_interval
        assert t is not None and m is not None
        assert t.level == m.level == 0.8 and t.basis and m.basis
        out.append((t.low, tokens, t.high, m.low, peak, m.high))
    return out


def test_the_pick_and_every_configuration_beside_it_carry_intervals(llama8b_request: PlanRequest) -> None:
    plan = make_plan(llama8b_request)
    assert plan.alternatives and plan.pareto_front
    for t_low, tokens, t_high, m_low, peak, m_high in _intervals(plan):
        assert t_low < tokens < t_high and m_low < peak < m_high
    assert plan.network_assumed is False  # one node: no network between nodes to assume
    assert "network_assumed" not in {w.code for w in plan.warnings}
    # The document round-trips with them (the API and the database store this JSON).
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_an_unstated_network_widens_the_throughput_interval_and_is_named() -> None:
    assumed = make_plan(make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=128))
    catalog_gbps = assumed.cluster.gpu_spec.inter_node_bandwidth_gbps
    stated = make_plan(PlanRequest(
        model=resolve_model("llama3-70b"),
        cluster=ClusterSpec(num_nodes=4, gpus_per_node=8, gpu="H100", inter_node_bandwidth_gbps=catalog_gbps),
        training=TrainingSpec(seq_len=8192, global_batch_tokens=8192 * 128),
    ))
    assert assumed.network_assumed is True and stated.network_assumed is False
    assert assumed.config == stated.config  # the same network, once stated
    assert assumed.prediction.tokens_per_s_per_gpu == pytest.approx(stated.prediction.tokens_per_s_per_gpu)
    a, s = assumed.prediction.tokens_per_s_per_gpu_interval, stated.prediction.tokens_per_s_per_gpu_interval
    assert a is not None and s is not None
    assert a.low < s.low and a.high >= s.high  # a slower plausible network lowers the low end
    assert "network not stated" in a.basis and "network" not in s.basis
    codes = {w.code for w in assumed.warnings}
    assert "network_assumed" in codes and "network_assumed" not in {w.code for w in stated.warnings}


def _candidate(plan: Plan, tokens: float) -> Candidate:
    return Candidate(
        label="runner-up", config=plan.config, step_time_s=1.0, tokens_per_s_per_gpu=tokens, mfu=0.4,
        peak_memory_gib=10.0, exposed_comm_s=0.0,
        relative_throughput=tokens / plan.prediction.tokens_per_s_per_gpu,
    )


def test_a_lead_the_model_cannot_tell_apart_is_said(llama8b_request: PlanRequest) -> None:
    plan = make_plan(llama8b_request)
    pick = plan.prediction.tokens_per_s_per_gpu
    paired = lead_uncertainty()
    assert paired is not None and paired.pairs >= 4  # the held-out runs make pairs (intervals.json)
    # The pick and the runner-up share their model, GPU and cluster: judged on pairs of held-out
    # runs of one setup (how surely the model ranks two configurations), not on one run's interval.
    threshold = pick / math.exp(paired.q)
    # The runner-up is the fastest other family that lost on speed (not an alternative that differs
    # from the pick by a bucket cap only), where one exists.
    close = RejectedFamily(family="full_shard dp8x1 tp1 compiled", kind="slower", reason="slower",
                           best_tokens_per_s_per_gpu=threshold * 1.01)
    far = close.model_copy(update={"best_tokens_per_s_per_gpu": threshold * 0.99})
    oom = RejectedFamily(family="no_shard dp8x1 tp1 compiled", kind="oom", reason="OOM")
    near_alternative = (_candidate(plan, pick * 0.999),)
    warning = lead_within_interval(plan.prediction, near_alternative, (far, close, oom))
    assert warning is not None and warning.code == "lead_within_interval"
    assert "full_shard dp8x1 tp1 compiled" in warning.message
    assert f"{paired.pairs} pairs of held-out runs" in warning.message
    assert lead_within_interval(plan.prediction, near_alternative, (far, oom)) is None
    # Without another family, the first alternative stands in.
    assert lead_within_interval(plan.prediction, near_alternative, (oom,)) is not None
    assert lead_within_interval(plan.prediction, (), (oom,)) is None
    # The real plan: its runner-up family is under 1% slower, well inside what pairs can tell apart.
    assert "lead_within_interval" in {w.code for w in plan.warnings}


def test_every_named_caveat_is_a_plan_warning_code() -> None:
    # A GPU type no priced run used, more GPUs than any run, degrees past any run's, and no network.
    cluster = ClusterSpec.parse("1024x8xL4")
    caveats = coverage_warnings(cluster=cluster, mesh=Mesh(pp=64, dp_shard=8, cp=16, tp=8))
    codes = {c.code for c in caveats}
    assert {"gpu_outside_corpus", "cluster_size_outside_corpus", "degree_outside_corpus",
            "network_assumed"} <= codes
    allowed = set(typing.get_args(PlanWarning.model_fields["code"].annotation))
    assert codes <= allowed
    for caveat in caveats:
        PlanWarning(code=caveat.code, message=caveat.message)  # type: ignore[arg-type]


def test_a_study_row_carries_the_intervals_and_the_days_and_cost_they_imply() -> None:
    study = StudyRequest.model_validate({
        "model": resolve_model("llama3-8b").model_dump(), "token_budget": 10**12, "gpus": [{"gpu": "H100"}],
        "cluster_sizes": [8], "seq_len": 8192, "global_batch_tokens": 8192 * 16,
    })
    (candidate,) = study.candidates()
    assert candidate.request is not None
    point = study_point(study, candidate, make_plan(candidate.request))
    t, d, c = point.tokens_per_s_per_gpu_interval, point.days_interval, point.cost_interval
    assert t is not None and d is not None and c is not None and point.peak_memory_gib_interval is not None
    assert d.low < point.days < d.high and c.low < point.cost < c.high
    # Days go as one over the throughput: the slowest end of the interval is the longest.
    assert d.high == pytest.approx(point.days * point.tokens_per_s_per_gpu / t.low)
    assert c.low == pytest.approx(point.cost * point.tokens_per_s_per_gpu / t.high)


def test_the_cli_prints_the_intervals_and_what_they_rest_on() -> None:
    result = runner.invoke(app, [
        "plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "8192",
        "--global-batch-tokens", str(8192 * 16),
    ], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    throughput = re.search(r"tokens/s/GPU\s+([\d,]+) \(([\d,]+)–([\d,]+)\)", result.output)
    assert throughput is not None, result.output
    low, value, high = (int(throughput.group(i).replace(",", "")) for i in (2, 1, 3))
    assert low < value < high
    assert re.search(r"peak memory\s+[\d.]+ GiB \([\d.]+–[\d.]+\) of", result.output)
    assert re.search(r"^80% interval +in brackets: 80% of measured runs", result.output, re.M)
    assert "held-out runs" in result.output
    # Every alternative's row too.
    rows = re.findall(r"│ \S+ dp\S+ .*? │ ([\d,]+) \(([\d,]+)–([\d,]+)\) │", result.output)
    assert len(rows) == 5, result.output


def test_a_schema_2_1_document_reads_without_intervals(llama8b_request: PlanRequest) -> None:
    document = make_plan(llama8b_request).model_dump(mode="json")
    old = as_schema_2_1(document)
    assert "tokens_per_s_per_gpu_interval" not in old["prediction"]
    read = Plan.model_validate(old)
    assert read.schema_version == "2.1" and read.network_assumed is None
    assert read.prediction.tokens_per_s_per_gpu_interval is None
    assert all(c.peak_memory_gib_interval is None for c in read.alternatives)
    # The runtime's own reader too, and the CLI prints it (without brackets).
    assert parse_plan(old).config == parse_plan(document).config
    console = Console(width=200, record=True)
    print_plan(read, console)
    text = console.export_text()
    assert "80% interval " not in text and re.search(r"^tokens/s/GPU +[\d,]+ *$", text, re.M)


def test_predict_prices_a_configuration_with_or_without_its_intervals(llama8b_request: PlanRequest) -> None:
    config = make_plan(llama8b_request).config
    with_them = predict(llama8b_request, config)
    without = predict(llama8b_request, config, intervals=False)
    interval = with_them.prediction.tokens_per_s_per_gpu_interval
    assert interval is not None and interval.low < with_them.prediction.tokens_per_s_per_gpu < interval.high
    assert with_them.alternatives == () and "lead_within_interval" not in {w.code for w in with_them.warnings}
    # The corpus fit's pricing: the same prediction, no interval and none of the warnings they imply.
    assert without.prediction.tokens_per_s_per_gpu == with_them.prediction.tokens_per_s_per_gpu
    assert without.prediction.tokens_per_s_per_gpu_interval is None and without.network_assumed is None


def test_the_cli_json_carries_the_intervals(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, [
        "plan", "--model", "llama-debug", "--cluster", "2x2xcpu", "--seq-len", "128",
        "--global-batch-tokens", "1024", "--precision", "fp32", "--json", "-o", str(out),
    ])
    assert result.exit_code == 0, result.output
    for document in (json.loads(result.output), json.loads(out.read_text())):
        prediction = document["prediction"]
        t = prediction["tokens_per_s_per_gpu_interval"]
        assert t["low"] < prediction["tokens_per_s_per_gpu"] < t["high"]
        assert "network not stated" in t["basis"]
        beside = document["alternatives"]
        assert beside and all(c["peak_memory_gib_interval"]["high"] > c["peak_memory_gib"] for c in beside)
        assert document["network_assumed"] is True and document["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize(("model", "cluster", "sequences", "search"), [
    ("llama3-8b", "4x8xH100", 64, {}),
    ("llama3-70b", "32x8xH100", 512, {"tensor_parallel_degrees": [8]}),  # a pipeline plan and tp plans
])
def test_the_network_prices_share_the_search_caches_and_change_nothing(
    model: str, cluster: str, sequences: int, search: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The intervals' prices on another network share the search's collective layouts
    # (Estimator.with_params): the same plan, to the last digit, as with estimators of their own.
    request = make_request(model, cluster, seq_len=8192, sequences=sequences, search=SearchSpace(**search))
    shared = make_plan(request)
    interval = shared.prediction.tokens_per_s_per_gpu_interval
    assert shared.network_assumed and interval is not None and "network not stated" in interval.basis

    def own(self: Estimator, params: CostParameters) -> Estimator:
        return Estimator(replace(self.setting, params=params))

    monkeypatch.setattr(Estimator, "with_params", own)
    assert make_plan(request) == shared
