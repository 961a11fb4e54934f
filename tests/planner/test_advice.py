"""The planner's advice is accepted by the planner itself (planner/infeasibility.py,
planner/precheck.py, planner/plan_warnings.py).

Every cluster and batch the advice names is planned here with `make_plan`; every claim about what
dominates memory is checked against the plan's own breakdown.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from click.testing import Result
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from api.cli.main import app
from contract.mesh import Mesh
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.cost.estimate import Estimator
from planner.deadline import CpuDeadline
from planner.enumeration import enumerate_choices
from planner.errors import InfeasiblePlanError, PlanningError
from planner.infeasibility import dominant_term, infeasible_error
from planner.precheck import read_request
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.planner.conftest import make_request
from tests.planner.test_calibration import synthetic_profile


def refused(request: PlanRequest) -> InfeasiblePlanError:
    with pytest.raises(InfeasiblePlanError) as exc:
        make_plan(request)
    return exc.value


def variant(request: PlanRequest, *, nodes: int, tokens: int) -> PlanRequest:
    """The request on another node count and global batch, validated as a user's request is."""
    data = request.model_dump()
    data["cluster"]["num_nodes"] = nodes
    data["training"]["global_batch_tokens"] = tokens
    return PlanRequest.model_validate(data)


def test_405b_on_one_node_names_a_cluster_and_batch_that_plan() -> None:
    sequences = 1000  # splits over none of the clusters near the smallest that fits
    request = make_request("llama3.1-405b", "1x8xH100", seq_len=4096, sequences=sequences)
    error = refused(request)
    assert error.min_fitting_nodes is not None and error.suggested_global_batch_tokens is not None
    nodes, tokens = error.min_fitting_nodes, error.suggested_global_batch_tokens
    assert f"Smallest cluster that fits: {nodes}x8xH100-SXM-80GB" in error.message
    assert tokens != sequences * 4096 and f"global_batch_tokens {tokens}" in error.message

    plan = make_plan(variant(request, nodes=nodes, tokens=tokens))
    assert plan.prediction.peak_memory_gib <= plan.prediction.usable_memory_gib
    # ... and it is the smallest: one node fewer, with the batch nearest the request, is refused.
    fewer = 8 * (nodes - 1)
    nearest = min(
        (sequences // fewer * fewer, (sequences // fewer + 1) * fewer), key=lambda b: (abs(b - sequences), b)
    )
    with pytest.raises(InfeasiblePlanError):
        make_plan(variant(request, nodes=nodes - 1, tokens=nearest * 4096))

    # Keeping the requested batch: the cluster named plans it unchanged.
    same = error.min_fitting_nodes_same_batch
    assert same is not None and same > nodes
    assert f"keeping global_batch_tokens {sequences * 4096}: {same}x8xH100-SXM-80GB" in error.message
    make_plan(variant(request, nodes=same, tokens=4096 * sequences))


def test_405b_on_one_node_is_held_up_by_states_not_activations() -> None:
    error = refused(make_request("llama3.1-405b", "1x8xH100", seq_len=4096, sequences=1024))
    assert error.dominant_memory_term == "parameters, gradients and optimizer state"
    assert error.dominant_memory_gib is not None
    assert error.dominant_memory_gib > 0.9 * error.min_peak_memory_gib
    assert "activations dominate" not in error.message
    assert not error.needs_model_parallelism
    assert "shorten seq_len" not in error.message


def test_405b_at_seq_8192_without_tensor_parallelism_says_to_widen_it() -> None:
    request = make_request(
        "llama3.1-405b", "16x8xH100", seq_len=8192, sequences=1024, search={"tensor_parallel_degrees": [1]}
    )
    error = refused(request)
    assert error.min_fitting_nodes is None and error.needs_model_parallelism
    # 16 nodes search pipelines too: they split the states, not one micro-batch's activations.
    assert "Data and pipeline parallelism cannot fit it" in error.message
    assert "tensor parallelism beyond tp=1 (up to tp=8 splits this model" in error.message
    assert "more data-parallel GPUs shrink neither" in error.message
    assert "shorten seq_len" not in error.message


def test_70b_at_32k_fits_only_where_activations_dominate_and_says_so() -> None:
    # Data parallelism only: tensor (test_tensor_parallel.py) or context parallelism fits it on these
    # 32 GPUs.
    request = make_request(
        "llama3-70b", "4x8xH100", seq_len=32768, sequences=64,
        search={"tensor_parallel_degrees": [1], "context_parallel_degrees": [1]},
    )
    error = refused(request)
    assert error.needs_model_parallelism
    assert error.dominant_memory_term == "activations and the loss"
    assert "tensor parallelism beyond tp=1 (up to tp=8 splits this model; widen " \
        "search.tensor_parallel_degrees) or context parallelism (search.context_parallel_degrees) " \
        "would fit on fewer GPUs" in error.message
    assert error.min_fitting_nodes is not None and error.suggested_global_batch_tokens is not None
    plan = make_plan(
        variant(request, nodes=error.min_fitting_nodes, tokens=error.suggested_global_batch_tokens)
    )
    breakdown = plan.prediction.memory_breakdown_gib
    assert breakdown.activations + breakdown.logits > breakdown.params + breakdown.grads + breakdown.optimizer


def test_what_holds_the_memory_agrees_with_the_cluster_the_advice_names() -> None:
    """A refusal never says that more GPUs do not shrink what the larger cluster it names then fits:
    activations shrink where more GPUs split each sequence further (more cp or tp ranks), never with
    more data-parallel ranks."""
    split = refused(make_request("llama3-8b", "1x8xH100", seq_len=1_000_000, sequences=2))
    assert "Smallest cluster that fits: 2x8xH100-SXM-80GB (16 GPUs)" in split.message
    assert "is activations and the loss of 1 sequence split over 8 GPUs at cp=4 tp=2, which more GPUs " \
        "shrink only by splitting each sequence over more of them." in split.message
    assert "more GPUs do not shrink" not in split.message
    assert "(31.0 GiB for 1 sequence of 1000000 tokens split over 16 GPUs at cp=8 tp=2)" in split.message
    data_parallel = refused(make_request(
        "llama3-70b", "4x8xH100", seq_len=32768, sequences=64,
        search={"tensor_parallel_degrees": [1], "context_parallel_degrees": [1]},
    ))
    assert data_parallel.min_fitting_nodes is not None  # the states shrink there, the activations do not
    assert "is activations and the loss of 1 sequence per GPU, which more data-parallel GPUs do not " \
        "shrink." in data_parallel.message


def test_advice_respects_the_replanning_ceiling() -> None:
    # A ceiling (set when re-planning after an OOM) that 8 GPUs cannot meet: the cluster named must
    # plan under the same ceiling.
    request = make_request(
        "llama3-70b", "1x8xH100", seq_len=4096, sequences=64, search={"max_peak_memory_gib": 40.0}
    )
    error = refused(request)
    assert error.min_fitting_nodes is not None and error.suggested_global_batch_tokens is not None
    plan = make_plan(
        variant(request, nodes=error.min_fitting_nodes, tokens=error.suggested_global_batch_tokens)
    )
    assert plan.prediction.peak_memory_gib < 40.0


def _slow_network_405b(sequences: int, *, pipeline: bool = False) -> PlanRequest:
    # 50 Gb/s per GPU between nodes: every all-gather brings the whole 405B model into each node.
    return PlanRequest(
        model=resolve_model("llama3.1-405b"),
        cluster=ClusterSpec(num_nodes=128, gpus_per_node=8, gpu="H100", inter_node_bandwidth_gbps=6.25),
        training=TrainingSpec(seq_len=2048, global_batch_tokens=2048 * sequences),
        search=SearchSpace(pipeline_parallel_degrees=None if pipeline else [1]),
    )


def test_405b_over_a_slow_network_trades_fsdp_traffic_for_pipeline_stages() -> None:
    flat = make_plan(_slow_network_405b(2048))
    staged = make_plan(_slow_network_405b(2048, pipeline=True))
    assert staged.config.mesh.pp > 1
    assert staged.prediction.tokens_per_s_per_gpu > 1.5 * flat.prediction.tokens_per_s_per_gpu
    flat_share = flat.prediction.exposed_comm_s / flat.prediction.step_time_s
    assert staged.prediction.exposed_comm_s / staged.prediction.step_time_s < flat_share / 2
    # With pipelines searched, the warning (if any) no longer suggests them.
    assert all("pipeline parallelism" not in w.message for w in staged.warnings)


def test_405b_on_1024_gpus_over_a_slow_network_warns_that_it_is_communication_bound() -> None:
    plan = make_plan(_slow_network_405b(2048))
    warnings = {w.code: w.message for w in plan.warnings}
    assert "communication_bound" in warnings
    share = plan.prediction.exposed_comm_s / plan.prediction.step_time_s
    assert f"{share:.0%} of the step is exposed communication" in warnings["communication_bound"]
    # Across nodes tensor parallelism moves as many bytes per node: the advice names what helps.
    assert "A larger global batch (more tokens per GPU per step), a faster network between nodes or " \
        "pipeline parallelism would cut it" in warnings["communication_bound"]
    larger = make_plan(_slow_network_405b(8192))
    assert larger.prediction.exposed_comm_s / larger.prediction.step_time_s < share / 1.5


def test_a_plan_waiting_on_its_experts_all_to_alls_says_so_not_that_fsdp_moves_the_model() -> None:
    # DeepSeek-V3 at ep 256 gathers none of its routed experts: nearly all of its exposed
    # communication is the token dispatch and combine, which a larger batch does not shrink.
    plan = make_plan(make_request("deepseek-v3", "32x8xH100", seq_len=4096, sequences=4096))
    assert plan.config.mesh.ep > 1
    assert plan.prediction.exposed_expert_parallel_s > plan.prediction.exposed_comm_s / 2
    message = {w.code: w.message for w in plan.warnings}["communication_bound"]
    assert "expert parallelism's token dispatch and combine all-to-alls" in message
    assert "moves the whole model's parameters" not in message
    assert "A larger global batch" not in message


def test_a_plan_that_overlaps_its_communication_carries_no_warning(llama8b_request: PlanRequest) -> None:
    plan = make_plan(llama8b_request)
    assert plan.prediction.exposed_comm_s / plan.prediction.step_time_s < 0.25
    # (It says that its lead over the runner-up is inside its interval: tests/planner/test_plan_intervals.py.)
    assert {w.code for w in plan.warnings} == {"lead_within_interval"}


def test_seq_len_beyond_the_models_positions_warns() -> None:
    plan = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=16384, sequences=8))
    (warning,) = [w for w in plan.warnings if w.code == "seq_len_beyond_max_position"]
    assert "seq_len 16384 is beyond llama3-8b's 8192 positions" in warning.message
    within = make_plan(make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8))
    assert all(w.code != "seq_len_beyond_max_position" for w in within.warnings)


def test_gpt2_past_its_position_table_is_refused() -> None:
    # GPT-2 learns one embedding per position: the runtime cannot run a longer sequence.
    with pytest.raises(PlanningError) as exc:
        make_plan(make_request("gpt2", "1x8xH100", seq_len=2048, sequences=8))
    assert exc.value.field == "training.seq_len"
    assert "use seq_len <= 1024" in exc.value.message


def suggested_batches(message: str) -> list[int]:
    return [int(tokens) for tokens in re.findall(r"\d+ sequences? = (\d+) tokens", message)]


def batch_refusal(request: PlanRequest) -> str:
    """The search's refusal of a batch that does not split (planner/precheck.py), naming the field."""
    with pytest.raises(PlanningError) as exc:
        make_plan(request)
    assert not isinstance(exc.value, InfeasiblePlanError)
    assert exc.value.field == "training.global_batch_tokens", exc.value.message
    return exc.value.message


def test_suggested_batches_plan() -> None:
    text = batch_refusal(make_request("llama3-8b", "3x8xH100", seq_len=4096, sequences=100))
    assert "cannot be split evenly over 24 GPUs" in text
    batches = suggested_batches(text)
    assert batches, text
    for tokens in batches:
        make_plan(make_request("llama3-8b", "3x8xH100", seq_len=4096, sequences=tokens // 4096))


def test_a_batch_suggestion_where_nothing_fits_names_the_cluster_that_does() -> None:
    # The trap: 1024 sequences over 33x8, where no batch fits with data parallelism alone
    # (with tensor parallelism 1056 sequences fit there).
    data_parallel = {"tensor_parallel_degrees": [1]}
    text = batch_refusal(
        make_request("llama3.1-405b", "33x8xH100", seq_len=4096, sequences=1024, search=data_parallel)
    )
    assert "does not fit on 33x8xH100-SXM-80GB at any such batch" in text
    assert suggested_batches(text) == []  # no batch is offered for a cluster that cannot take one
    found = re.search(r"Smallest cluster that fits: (\d+)x8xH100-SXM-80GB .*?global_batch_tokens (\d+)", text)
    assert found, text
    nodes, tokens = int(found[1]), int(found[2])
    make_plan(
        make_request(
            "llama3.1-405b", f"{nodes}x8xH100", seq_len=4096, sequences=tokens // 4096, search=data_parallel
        )
    )


@pytest.mark.parametrize(
    ("model", "cluster", "seq_len", "sequences"),
    [
        ("llama3-70b", "2x8xH100", 4096, 64),
        ("llama-debug", "1x4xcpu", 256, 16),
        ("gpt2", "4x8xA100", 1024, 64),
    ],
)
def test_no_configuration_is_lighter_than_its_fully_sharded_twin(
    model: str, cluster: str, seq_len: int, sequences: int
) -> None:
    # The advice skips configurations whose fully sharded twin was priced (planner/infeasibility.py):
    # this holds the memory model to that.
    request = make_request(model, cluster, seq_len=seq_len, sequences=sequences)
    setting = build_setting(request)
    estimator = Estimator(setting)
    world = request.cluster.world_size
    for choice in enumerate_choices(request, setting):
        pp, cp, tp = choice.mesh.pp, choice.mesh.cp, choice.mesh.tp
        if world == pp * tp:
            continue  # one rank per replica: no fully sharded twin is searched (nothing to shard)
        twin = replace(
            choice, sharding="full_shard", mesh=Mesh(pp=pp, dp_shard=world // (pp * cp * tp), cp=cp, tp=tp)
        )
        assert estimator.memory(choice).total >= estimator.memory(twin).total - 1e-6, choice


def test_dominant_term_of_a_fitting_plan_is_what_its_breakdown_says(llama8b_request: PlanRequest) -> None:
    setting = build_setting(llama8b_request)
    choice = next(enumerate_choices(llama8b_request, setting))
    memory = Estimator(setting).memory(choice)
    dominant = dominant_term(memory)
    assert 0 < dominant.share <= 1
    assert dominant.gib * 2**30 >= max(memory.terms().values()) - 1e-6


def test_partial_sequences_are_refused_with_batches_that_plan_on_this_cluster() -> None:
    # TrainingSpec alone cannot know the cluster; given the training as typed beside it, the refusal
    # names whole-sequence batches that split over 24 GPUs and fit.
    with pytest.raises(PlanningError) as exc:
        read_request({
            "model": resolve_model("llama3-8b"),
            "cluster": ClusterSpec.parse("3x8xH100"),
            "training": {"seq_len": 4096, "global_batch_tokens": 400_000},
        })
    assert exc.value.field == "training.global_batch_tokens"
    text = exc.value.message
    assert "training.global_batch_tokens: 400000 is not a whole number of 4096-token sequences" in text
    batches = suggested_batches(text)
    assert batches, text
    for tokens in batches:
        make_plan(make_request("llama3-8b", "3x8xH100", seq_len=4096, sequences=tokens // 4096))


def plan_cli(model: str, cluster: str, seq_len: int, tokens: int) -> Result:
    return CliRunner().invoke(
        app,
        ["plan", "--model", model, "--cluster", cluster, "--seq-len", str(seq_len),
         "--global-batch-tokens", str(tokens)],
    )


def test_the_readme_405b_example_advice_is_accepted_by_the_cli() -> None:
    refusal = plan_cli("llama3.1-405b", "1x8xH100", 4096, 4096000)
    assert refusal.exit_code == 3, refusal.output
    text = " ".join(refusal.output.split())  # rich wraps long lines
    advice = r"Smallest cluster that fits: (\d+x8)xH100-SXM-80GB .*? --global-batch-tokens (\d+)"
    found = re.search(advice, text)
    assert found, text
    accepted = plan_cli("llama3.1-405b", f"{found[1]}xH100", 4096, int(found[2]))
    assert accepted.exit_code == 0, accepted.output
    # There it is tensor-parallel: tp shrinks the states as much as sharding and the activations too.
    assert re.search(r"full_shard dp\d+x1 tp[2-8] ", " ".join(accepted.output.split())), accepted.output


def test_calibrated_advice_plans_with_the_same_calibration() -> None:
    # The advice prices other clusters with the request's fitted (calibrated) parameters.
    profile = CalibrationProfile.model_validate(
        synthetic_profile(efficiency=0.4, overhead=2e-5, latency=3e-5, bandwidth=200e9)
    )
    request = make_request("llama3.1-405b", "1x8xH100", seq_len=4096, sequences=1024)
    with pytest.raises(InfeasiblePlanError) as exc:
        make_plan(request, calibration=profile)
    error = exc.value
    assert error.min_fitting_nodes is not None and error.suggested_global_batch_tokens is not None
    plan = make_plan(
        variant(request, nodes=error.min_fitting_nodes, tokens=error.suggested_global_batch_tokens),
        calibration=profile,
    )
    assert plan.calibration_id is not None


def test_a_batch_suggestion_says_when_seq_len_must_change_first() -> None:
    with pytest.raises(PlanningError) as exc:
        read_request({
            "model": resolve_model("gpt2"),
            "cluster": ClusterSpec.parse("1x8xH100"),
            "training": {"seq_len": 4096, "global_batch_tokens": 3 * 4096 + 1},
        })
    text = exc.value.message
    assert "that fits" not in text and not suggested_batches(text)  # nothing plans at this seq_len
    assert "use seq_len <= 1024" in text
    with pytest.raises(PlanningError) as exc:  # a whole batch that does not split: seq_len first
        make_plan(make_request("gpt2", "1x8xH100", seq_len=4096, sequences=3))
    assert exc.value.field == "training.seq_len" and "use seq_len <= 1024" in exc.value.message


CLUSTER_ADVICE = re.compile(
    r"Smallest cluster that fits: (\d+)x\d+x\S+ \(\d+ GPUs\)( with global_batch_tokens (\d+))?"
)


@st.composite
def heavy_requests(draw: st.DrawFn) -> PlanRequest:
    """Random Llama-shaped requests, mostly too big for their cluster (so the advice is exercised),
    some with a batch that splits over no searched tensor-parallel degree's data-parallel ranks."""
    heads = draw(st.sampled_from([32, 64, 128]))
    model = ModelSpec(
        name="random",
        architecture="llama",
        vocab_size=draw(st.integers(32_000, 200_000)),
        hidden_size=heads * 128,
        num_layers=draw(st.integers(16, 128)),
        num_heads=heads,
        num_kv_heads=8,
        intermediate_size=heads * 128 * draw(st.sampled_from([3, 4])),
        max_seq_len=131072,
    )
    nodes, gpus = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4, 8]))
    gpu = draw(st.sampled_from(["L4", "A100-40GB", "H100"]))
    seq_len = draw(st.sampled_from([2048, 4096, 8192, 32768]))
    sequences = nodes * gpus * draw(st.integers(1, 4)) + draw(st.sampled_from([0, 0, 1]))
    return PlanRequest(
        model=model,
        cluster=ClusterSpec(num_nodes=nodes, gpus_per_node=gpus, gpu=gpu),
        training=TrainingSpec(seq_len=seq_len, global_batch_tokens=seq_len * sequences),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heavy_requests())
def test_any_advised_cluster_and_batch_plans(request: PlanRequest) -> None:
    # End to end through the messages: what a refusal names, planned as a user would retype it.
    try:
        make_plan(request)
    except InfeasiblePlanError as error:
        if error.min_fitting_nodes is None:
            assert error.needs_model_parallelism
            return
        assert error.suggested_global_batch_tokens is not None
        make_plan(variant(request, nodes=error.min_fitting_nodes, tokens=error.suggested_global_batch_tokens))
        if error.min_fitting_nodes_same_batch is not None:
            make_plan(
                variant(
                    request,
                    nodes=error.min_fitting_nodes_same_batch,
                    tokens=request.training.global_batch_tokens,
                )
            )
    except PlanningError as error:
        assert error.field == "training.global_batch_tokens", error.message
        batches = suggested_batches(error.message)
        found = CLUSTER_ADVICE.search(error.message)
        assume(batches or found is not None)  # data parallelism alone cannot fit it: nothing to plan
        for tokens in batches:
            make_plan(variant(request, nodes=request.cluster.num_nodes, tokens=tokens))
        if found is not None:
            tokens = int(found[3] or request.training.global_batch_tokens)
            make_plan(variant(request, nodes=int(found[1]), tokens=tokens))


def test_a_refusal_without_advice_says_why_at_the_same_numbers() -> None:
    # What a what-if study asks for (it tries its own cluster sizes): why nothing fits here, the same
    # peak and capacity as the full refusal, and no search of other clusters.
    request = make_request("llama3.1-405b", "1x8xH100", seq_len=4096, sequences=1024)
    advised = refused(request)
    with pytest.raises(InfeasiblePlanError) as exc:
        make_plan(request, advise_other_clusters=False)
    bare = exc.value
    numbers = (bare.min_peak_memory_gib, bare.capacity_gib, bare.dominant_memory_term)
    assert numbers == (advised.min_peak_memory_gib, advised.capacity_gib, advised.dominant_memory_term)
    assert bare.min_fitting_nodes is None and bare.suggested_global_batch_tokens is None
    assert advised.min_fitting_nodes is not None
    assert "Smallest cluster" not in bare.message
    assert bare.message.startswith("llama3.1-405b does not fit on 1x8")


def test_a_refusal_looks_for_another_cluster_within_the_searchs_deadline() -> None:
    # The search that found nothing fitting hands its deadline on: past it, the refusal says why
    # nothing fits here and that looking elsewhere stopped, instead of probing on unbounded.
    request = make_request("llama3.1-405b", "1x8xH100", seq_len=4096, sequences=1024)
    advised = refused(request)
    setting = build_setting(request)
    stopped = infeasible_error(
        request, setting, limit_gib=advised.capacity_gib, peak_gib=advised.min_peak_memory_gib,
        deadline=CpuDeadline.after(0.0),
    )
    assert stopped.min_fitting_nodes is None and stopped.min_peak_memory_gib == advised.min_peak_memory_gib
    assert stopped.message.endswith(
        "Looking for a cluster that fits stopped after 0 s of CPU time, the limit per plan."
    )
    assert "Smallest cluster" not in stopped.message
