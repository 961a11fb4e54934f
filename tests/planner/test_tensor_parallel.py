"""Tensor parallelism in the search: the axis, its pins, its cost and memory terms, and the
search's floor test that leaves provably beaten configurations untimed."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.mesh import Mesh
from planner.cost.estimate import Estimator
from planner.cost.parameters import GIB
from planner.cost.repeats import Run
from planner.cost.setting import Choice
from planner.cost.timeline import CommFloor, GroupTimes, RepeatedGroups, simulate
from planner.enumeration import enumerate_choices, tensor_parallel_degrees
from planner.errors import InfeasiblePlanError, PlanningError
from planner.plan import Plan
from planner.search import _Leaderboard, make_plan, predict
from planner.search_setting import build_setting
from planner.specs import SearchSpace
from tests.older_schemas import as_schema_1
from tests.planner.conftest import make_request

SIXTEEN_M_TOKENS = 16 * 1024 * 1024


def degree_rows(plan: Plan, tp: int) -> list:
    """The rows of "why the other families lost" at tp alone (no pp or cp), fastest first: the
    first stands for the degree (a row is labelled with its configuration's whole mesh)."""
    rows = [r for r in plan.rejected if f"tp{tp}" in r.family.split()
            and not any(word.startswith(("pp", "cp")) for word in r.family.split())]
    return sorted(rows, key=lambda r: -(r.best_tokens_per_s_per_gpu or 0.0))


def test_405b_at_seq_8192_with_16m_tokens_fits_on_128x8_only_with_tensor_parallelism() -> None:
    request = make_request("llama3.1-405b", "128x8xH100", seq_len=8192, sequences=SIXTEEN_M_TOKENS // 8192)
    plan = make_plan(request)
    assert plan.config.mesh.tp > 1
    assert plan.config.mesh.world_size == 1024
    assert plan.prediction.peak_memory_gib < 80
    # The plan explains the axis: tp=1 does not fit, by how much.
    tp1 = degree_rows(plan, 1)
    assert tp1 and all(r.kind == "oom" and r.reason.startswith("OOM by ") for r in tp1)
    with pytest.raises(InfeasiblePlanError):
        make_plan(
            request.model_copy(
                update={"search": request.search.model_copy(update={"tensor_parallel_degrees": [1]})}
            )
        )


def test_70b_at_seq_8192_on_32x8_returns_a_plan() -> None:
    plan = make_plan(make_request("llama3-70b", "32x8xH100", seq_len=8192, sequences=512))
    assert plan.prediction.tokens_per_s_per_gpu > 0
    for tp in {1, 2, 4, 8} - {plan.config.mesh.tp}:
        assert degree_rows(plan, tp), f"tp={tp} lost without a row"


def test_8b_on_one_node_prices_tp_1_and_tp_2_within_a_few_percent() -> None:
    # Published runs of 8B on one H100 node use FSDP alone; tensor parallelism may only tie it there
    # (it halves activations, so it trades checkpointing for per-layer collectives).
    plan = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=32))
    assert plan.config.mesh.tp in (1, 2)
    other = degree_rows(plan, 3 - plan.config.mesh.tp)[0]
    assert other.kind == "slower" and other.best_tokens_per_s_per_gpu is not None
    assert other.best_tokens_per_s_per_gpu > 0.95 * plan.prediction.tokens_per_s_per_gpu
    tp8 = degree_rows(plan, 8)[0]
    assert "tp=8 per-layer collectives" in tp8.reason


def test_a_pinned_degree_is_respected_and_explained() -> None:
    plan = make_plan(
        make_request(
            "llama3-8b", "1x8xH100", seq_len=8192, sequences=32, search={"tensor_parallel_degrees": [4]}
        )
    )
    assert plan.config.mesh.tp == 4
    assert all(c.config.mesh.tp == 4 for c in (*plan.alternatives, *plan.pareto_front))
    mesh = plan.config.mesh
    dp = f"dp{mesh.dp_shard}x{mesh.dp_replicate}"
    assert plan.config.label().startswith(f"{plan.config.sharding} {dp} tp4 ")
    assert plan.prediction.exposed_tensor_parallel_s > 0


def test_a_pin_that_cannot_split_the_model_is_refused_with_why() -> None:
    request = make_request(
        "llama3-8b", "1x8xH100", seq_len=4096, sequences=16, search={"tensor_parallel_degrees": [3]}
    )
    with pytest.raises(PlanningError, match=r"tp=3 must divide each of num_heads 32, num_kv_heads 8"):
        make_plan(request)


def test_a_pin_that_cannot_fit_is_refused_as_infeasible() -> None:
    request = make_request(
        "llama3.1-405b", "16x8xH100", seq_len=8192, sequences=128, search={"tensor_parallel_degrees": [2]}
    )
    with pytest.raises(InfeasiblePlanError) as exc:
        make_plan(request)
    # The advice searches the same pinned space: it names the cluster where tp=2 fits.
    assert re.search(r"\(full_shard dp\d+x1 tp2 ", exc.value.message), exc.value.message
    assert exc.value.min_fitting_nodes is not None and exc.value.min_fitting_nodes > 16


def test_tensor_parallelism_only_for_the_llama_family() -> None:
    gpt2 = make_request("gpt2", "1x8xA100", seq_len=1024, sequences=64)
    assert tensor_parallel_degrees(gpt2) == [1]
    pinned = make_request(
        "gpt2", "1x8xA100", seq_len=1024, sequences=64, search={"tensor_parallel_degrees": [2]}
    )
    with pytest.raises(PlanningError, match="needs a llama-family model"):
        make_plan(pinned)


def test_memory_terms_divide_by_tp_where_the_runtime_splits() -> None:
    request = make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=32)
    estimator = Estimator(build_setting(request))
    base = Choice(sharding="full_shard", mesh=Mesh(dp_shard=32), checkpointing="none")
    tp4 = replace(base, mesh=Mesh(dp_shard=8, tp=4))
    one, four = estimator.moments(base)[0], estimator.moments(tp4)[0]
    # States are divided over dp_shard x tp = 32 either way (norm weights are replicated: a hair more).
    assert four.params == pytest.approx(one.params, rel=1e-3) and four.params >= one.params
    # Sequence parallelism divides activations by tp, but for the inputs the column-parallel
    # matmuls all-gather and keep whole (two hidden-sized tensors a block); the vocabulary-parallel
    # loss divides its slice.
    spec = request.model
    gathered = 2 * spec.hidden_size * (1 - 1 / 4) * 8192 * 2 * spec.num_layers  # bf16, every block
    assert four.activations == pytest.approx(one.activations / 4 + gathered, rel=0.02)
    assert four.logits < one.logits / 2


def test_tensor_parallel_collectives_are_priced_and_exposed() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=16)
    estimator = Estimator(build_setting(request))
    tp2 = Choice(sharding="full_shard", mesh=Mesh(dp_shard=4, tp=2), checkpointing="none", micro_batch_size=2)
    time = estimator.timing(tp2)
    assert time.tensor_parallel_s > 0
    assert time.exposed_comm_s >= time.tensor_parallel_s
    # Whole-block recompute re-runs the forward collectives.
    full = estimator.timing(replace(tp2, checkpointing="full"))
    assert full.tensor_parallel_s == pytest.approx(1.5 * time.tensor_parallel_s, rel=0.05)


def test_predict_prices_a_2d_configuration_and_checks_its_mesh() -> None:
    request = make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=32)
    plan = make_plan(
        request.model_copy(
            update={"search": request.search.model_copy(update={"tensor_parallel_degrees": [8]})}
        )
    )
    again = predict(request, plan.config)
    assert again.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s)
    broken = replace(plan.config, mesh=Mesh(pp=plan.config.mesh.pp, dp_replicate=1, dp_shard=8, tp=8))
    with pytest.raises(PlanningError, match="must equal the cluster's 32 GPUs"):
        predict(request, broken)


def test_schema_1_plans_read_as_their_mesh() -> None:
    search = SearchSpace(tensor_parallel_degrees=[1])
    plan = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=16, search=search))
    old = as_schema_1(plan.model_dump(mode="json"))
    assert "shard_group_size" in old["config"] and "shard_group_size" in old["alternatives"][0]["config"]
    assert Plan.model_validate(old) == plan


@pytest.mark.parametrize(
    ("model", "cluster", "seq_len", "sequences"),
    [
        ("llama3-8b", "1x8xH100", 8192, 16),
        ("llama3-70b", "4x8xH100", 4096, 64),
        ("llama-debug", "1x4xcpu", 256, 16),
        ("gpt2", "2x8xA100", 1024, 64),
    ],
)
def test_leaving_beaten_configurations_untimed_changes_no_answer(
    model: str, cluster: str, seq_len: int, sequences: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = make_request(model, cluster, seq_len=seq_len, sequences=sequences)
    pruned = make_plan(request)
    monkeypatch.setattr(_Leaderboard, "dominated", lambda *_: False)
    full = make_plan(request)
    assert pruned == full


@pytest.mark.parametrize(
    ("model", "cluster", "sequences"), [("llama3-70b", "2x8xH100", 64), ("llama3-70b", "8x8xH100", 256)]
)
def test_the_step_floors_never_exceed_the_step(model: str, cluster: str, sequences: int) -> None:
    request = make_request(model, cluster, seq_len=4096, sequences=sequences)
    setting = build_setting(request)
    estimator = Estimator(setting)
    pipelines = 0
    for i, choice in enumerate(enumerate_choices(request, setting)):
        if i % 7:
            continue  # a sample keeps it quick
        step = estimator.timing(choice).step_time_s * (1 + 1e-12)
        # The priced floor (collectives that cannot hide) is the tighter one.
        assert estimator.floor_s(choice, priced=False) <= estimator.floor_s(choice) <= step, choice
        pipelines += choice.pipeline is not None
    assert pipelines  # the 8-node space holds pipelines


_SECONDS = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.lists(st.tuples(_SECONDS, _SECONDS, _SECONDS, _SECONDS, _SECONDS), min_size=1, max_size=4),
    head=st.tuples(_SECONDS, _SECONDS, _SECONDS, _SECONDS, _SECONDS),
    repeats=st.integers(min_value=1, max_value=6),
    depth=st.integers(min_value=0, max_value=3),
    contention=st.floats(min_value=0.0, max_value=1.0),
)
def test_the_collectives_floor_never_exceeds_the_timeline(
    pattern: list[tuple[float, ...]], head: tuple[float, ...], repeats: int, depth: int, contention: float
) -> None:
    groups = RepeatedGroups(
        (Run(0, 1, 1), Run(1, len(pattern), repeats)),
        ((GroupTimes(*head),), tuple(GroupTimes(*g) for g in pattern)),
    )
    compute = head[0] + head[1] + repeats * sum(g[0] + g[1] for g in pattern)
    comm_only = RepeatedGroups(
        groups.runs, tuple(tuple(replace(g, forward=0.0, backward=0.0) for g in p) for p in groups.patterns)
    )
    floor = CommFloor.of(comm_only).floor_s(compute)
    timeline = simulate(groups, prefetch_depth=depth, contention=contention)
    assert floor <= timeline.total_s * (1 + 1e-12) + 1e-15


def test_peaks_stay_under_the_gpu_with_tp_in_the_space() -> None:
    plan = make_plan(make_request("llama3.1-405b", "64x8xH100", seq_len=8192, sequences=1024))
    assert plan.prediction.peak_memory_gib * GIB <= plan.cluster.gpu_spec.memory_gib * GIB
