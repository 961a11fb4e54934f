"""Pipeline parallelism in the planner: stage splits, the schedules' bubble and activations in flight,
each pipeline rank priced as a model of its own, searched on multi-node clusters or pinned, explained,
and refused where the runtime cannot split the model."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from contract.mesh import Mesh
from contract.parallel_config import PipelineConfig, PipelineError
from planner.cost.estimate import Estimator, point_to_point_seconds
from planner.cost.pipeline import (
    BoundaryTensors,
    ChunkTimes,
    balanced_stage_split,
    boundary_tensors,
    bubble_fraction,
    bubble_seconds,
    in_flight_chunks,
)
from planner.document import choice_from_config
from planner.enumeration import enumerate_choices, pipeline_parallel_degrees
from planner.errors import PlanningError
from planner.search import make_plan, predict
from planner.search_setting import build_setting
from planner.specs import SearchSpace
from tests.planner.conftest import make_request


@pytest.mark.parametrize(
    ("blocks", "stages", "first", "last"),
    [(32, 4, 0.3, 3.0), (126, 16, 0.1, 1.5), (8, 8, 0.1, 2.0), (10, 3, 0.0, 0.0), (80, 8, 0.2, 4.6)],
)
def test_the_stage_split_is_the_most_balanced_one(
    blocks: int, stages: int, first: float, last: float
) -> None:
    split = balanced_stage_split(blocks, stages, first_extra=first, last_extra=last)
    assert sum(split) == blocks and len(split) == stages and min(split) >= 1

    def slowest(counts: tuple[int, ...]) -> float:
        loads = list(counts)
        loads[0] += first
        loads[-1] += last
        return max(loads)

    # No other split has a faster slowest stage (every split of a small case, and moving one block
    # between any two stages of a large one).
    if blocks <= 12:
        others = [c for c in itertools.product(range(1, blocks + 1), repeat=stages) if sum(c) == blocks]
    else:
        others = []
        for i, j in itertools.permutations(range(stages), 2):
            moved = list(split)
            moved[i] -= 1
            moved[j] += 1
            if moved[i] >= 1:
                others.append(tuple(moved))
    assert all(slowest(split) <= slowest(other) + 1e-9 for other in others)


def test_the_last_stage_takes_fewer_blocks_for_the_head() -> None:
    assert balanced_stage_split(32, 4, first_extra=0.2, last_extra=3.0) == (8, 9, 9, 6)
    with pytest.raises(ValueError, match="need at least 5 blocks"):
        balanced_stage_split(4, 5, first_extra=0.0, last_extra=0.0)


def test_bubbles_of_the_schedules() -> None:
    chunk = ChunkTimes(forward=1.0, input_grad=1.0, weight_grad=1.0)
    # (pp - 1) x (F + B + W), of a smaller chunk when interleaved.
    assert bubble_seconds("1F1B", pp=4, chunk=chunk, micro_batches=8) == pytest.approx(9.0)
    assert bubble_seconds("Interleaved1F1B", pp=4, chunk=chunk, micro_batches=8) == pytest.approx(9.0)
    # Zero-bubble V: weight gradients fill all but the ramp of forwards to the last rank.
    assert bubble_seconds("ZBVZeroBubble", pp=4, chunk=chunk, micro_batches=8) == pytest.approx(3.0, rel=2e-3)
    assert bubble_seconds("1F1B", pp=1, chunk=chunk, micro_batches=8) == 0.0
    # As a fraction of the step's compute: (pp - 1) / (v x m) for the 1F1B family.
    one = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(4, 4, 4, 4))
    two = PipelineConfig(schedule="Interleaved1F1B", stages_per_rank=2, stage_blocks=(2,) * 8)
    assert bubble_fraction(one, pp=4, micro_batches=8, chunk=chunk) == pytest.approx(3 / 8)
    assert bubble_fraction(two, pp=4, micro_batches=8, chunk=chunk) == pytest.approx(3 / 16)


def test_activations_in_flight() -> None:
    one = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(4, 4, 4, 4))
    assert [in_flight_chunks(one, pp=4, rank=r, micro_batches=8) for r in range(4)] == [4, 3, 2, 1]
    two = PipelineConfig(schedule="Interleaved1F1B", stages_per_rank=2, stage_blocks=(2,) * 8)
    # torch's interleaved warm-up: (v - 1) pp + 2 (pp - 1 - rank) forwards, then the first backward.
    assert [in_flight_chunks(two, pp=4, rank=r, micro_batches=8) for r in range(4)] == [11, 9, 7, 5]
    assert in_flight_chunks(two, pp=4, rank=0, micro_batches=4) == 8  # never more than m x v chunks
    zbv = PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=2, stage_blocks=(2,) * 8)
    assert [in_flight_chunks(zbv, pp=4, rank=r, micro_batches=8) for r in range(4)] == [8, 8, 8, 8]


def test_boundary_tensors_of_the_schedules() -> None:
    """torch's stages receive into one buffer per micro-batch and direction (no activations into the
    first stage, no gradients into the last) and keep each output sent on until its backward."""
    one = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(4, 4, 4, 4))
    held = [
        boundary_tensors(one, pp=4, rank=r, micro_batches=8, chunks_in_flight=4 - r) for r in range(4)
    ]
    assert held == [
        BoundaryTensors(received=8.0, sent=4.0),
        BoundaryTensors(received=16.0, sent=3.0),
        BoundaryTensors(received=16.0, sent=2.0),
        BoundaryTensors(received=8.0, sent=0.0),  # the last stage sends its loss to no one
    ]
    two = PipelineConfig(schedule="Interleaved1F1B", stages_per_rank=2, stage_blocks=(2,) * 8)
    # Rank 0 holds stages 0 and 4, rank 3 stages 3 and 7 (the last): 3 of 4 boundaries each.
    assert boundary_tensors(two, pp=4, rank=0, micro_batches=8, chunks_in_flight=11).received == 24.0
    last = boundary_tensors(two, pp=4, rank=3, micro_batches=8, chunks_in_flight=5)
    assert last == BoundaryTensors(received=24.0, sent=2.5)


def test_a_pipeline_rank_holds_its_boundary_tensors_at_every_moment() -> None:
    request = make_request("llama3-8b", "2x8xH100", seq_len=8192, sequences=64)
    base = make_plan(request).config
    pipeline = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(17, 15))
    choice = choice_from_config(_pipelined(request, base, pp=2, pipeline=pipeline))
    estimator = Estimator(build_setting(request, None, None))
    rank = next(r for r in estimator.pipeline_ranks(choice) if r.rank == 0)
    with_boundary = rank.estimator.rank_moments(choice, in_flight=rank.in_flight, boundary=rank.boundary)
    without = rank.estimator.rank_moments(choice, in_flight=rank.in_flight)
    # One micro-batch's hidden states on the rank: its tokens x hidden / tp, in bf16.
    tp = choice.mesh.tp
    hidden = choice.micro_batch_size * 8192 * 4096 // tp * 2
    received = rank.boundary.received * hidden
    assert rank.boundary.received == choice.grad_accum_steps  # rank 0 receives gradients only
    for moment, base_moment in zip(with_boundary, without, strict=True):
        extra = received + (0.0 if moment.moment == "optimizer step" else rank.boundary.sent * hidden)
        assert moment.activations - base_moment.activations == pytest.approx(extra)


def _pipelined(request, config, *, pp: int, pipeline: PipelineConfig, micro_batch: int = 1):
    dp = request.cluster.world_size // (pp * config.mesh.tp)
    local = request.training.global_batch_sequences // dp
    return replace(
        config,
        sharding="full_shard",
        mesh=Mesh(pp=pp, dp_shard=dp, tp=config.mesh.tp),
        pipeline=pipeline,
        micro_batch_size=micro_batch,
        grad_accum_steps=local // micro_batch,
    )


def test_a_pipeline_is_priced_as_its_slowest_rank_plus_bubble_and_sends() -> None:
    request = make_request("llama3-8b", "2x8xH100", seq_len=8192, sequences=64)
    base = make_plan(request).config
    pipeline = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(17, 15))
    config = _pipelined(request, base, pp=2, pipeline=pipeline)
    plan = predict(request, config)
    prediction = plan.prediction
    setting = build_setting(request, None, None)
    estimator = Estimator(setting)
    choice = choice_from_config(config)
    time = estimator.timing(choice)
    assert prediction.step_time_s == pytest.approx(time.step_time_s)
    assert prediction.pipeline_bubble_s > 0 and prediction.exposed_pipeline_p2p_s > 0
    # The bubble is (pp - 1) chunks of the slowest rank's work per micro-batch.
    around = time.pipeline_bubble_s + time.pipeline_p2p_s + time.optimizer_s + time.overhead_s
    busy = time.step_time_s - around
    assert time.pipeline_bubble_s == pytest.approx(busy / choice.grad_accum_steps, rel=1e-6)
    assert prediction.exposed_comm_s >= prediction.exposed_pipeline_p2p_s
    # A send is one micro-batch's hidden states over the link between the two nodes.
    send = point_to_point_seconds(estimator.setting_for(choice), choice)
    hidden_bytes = 8192 * 4096 * 2
    assert send > hidden_bytes / setting.params.links["inter"].bandwidth
    # At least one send per hop while the pipeline fills and one while it drains.
    assert time.pipeline_p2p_s >= 2 * (2 - 1) * send
    # Two ranks priced: rank 0 holds two micro-batches' activations under 1F1B, rank 1 one.
    ranks = estimator.pipeline_ranks(choice)
    assert sorted((r.rank, r.in_flight) for r in ranks) == [(0, 2.0), (1, 1.0)]


def test_the_first_rank_holds_pp_micro_batches_of_its_stage() -> None:
    request = make_request("llama3-8b", "2x8xH100", seq_len=8192, sequences=64)
    base = replace(make_plan(request).config, compile=True)
    flat = replace(
        base, sharding="full_shard", mesh=Mesh(dp_shard=16), micro_batch_size=1, grad_accum_steps=4
    )
    pipeline = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(16, 16))
    staged = _pipelined(request, base, pp=2, pipeline=pipeline)
    estimator = Estimator(build_setting(request, None, None))
    whole = max(estimator.moments(choice_from_config(flat)), key=lambda m: m.activations).activations
    ranks = {r.rank: r for r in estimator.pipeline_ranks(choice_from_config(staged))}
    first = max(ranks[0].estimator.rank_moments(choice_from_config(staged), in_flight=2.0),
                key=lambda m: m.activations).activations
    # Half the blocks, two micro-batches of them: about the whole model's one micro-batch (the head's
    # saved tensors stay on the last rank).
    assert first == pytest.approx(whole, rel=0.05)


def test_eager_fsdp2_under_a_pipeline_reduces_once_and_keeps_its_stage_gathered() -> None:
    request = make_request("llama3-8b", "2x8xH100", seq_len=8192, sequences=64)
    base = replace(make_plan(request).config, compile=False)
    pipeline = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(17, 15))
    eager = choice_from_config(_pipelined(request, base, pp=2, pipeline=pipeline))
    compiled = replace(eager, compile=True)
    assert eager.fsdp2_pipeline and not compiled.fsdp2_pipeline
    estimator = Estimator(build_setting(request, None, None))
    rank = estimator.pipeline_ranks(eager)[0].estimator
    eager_memory = max(rank.rank_moments(eager), key=lambda m: m.total)
    # The stage's unsharded gradients (fp32) and its gathered bf16 parameters are held.
    stage_params = rank.setting.model.rank_params
    assert eager_memory.grads >= 4 * stage_params * 0.99
    assert eager_memory.unsharded_params >= 2 * stage_params * 0.99
    # One reduce-scatter per step: the earlier micro-batches price none.
    priced = rank.price(eager)
    assert all(g.reduce == 0.0 for pattern in priced.middle.patterns for g in pattern)
    assert any(g.reduce > 0.0 for pattern in priced.last.patterns for g in pattern)


def test_405b_on_512_h100_plans_a_pipeline_faster_than_without() -> None:
    request = make_request("llama3.1-405b", "64x8xH100", seq_len=8192, sequences=2048)
    # Over 50 Gb/s per GPU between nodes, where pipelines pay: each stage's FSDP traffic stays in a
    # node's share of the data-parallel group (on the catalog's 400 Gb/s, FSDP x TP alone wins once
    # pipeline plans keep the wider margin their measured runs call for).
    slow = request.cluster.model_copy(update={"inter_node_bandwidth_gbps": 6.25})
    request = request.model_copy(update={"cluster": slow})
    plan = make_plan(request)
    assert plan.config.mesh.pp > 1 and plan.config.pipeline is not None
    assert f"pp{plan.config.mesh.pp}" in plan.config.label()
    assert sum(plan.config.pipeline.stage_blocks) == 126
    flat = make_plan(request.model_copy(update={"search": SearchSpace(pipeline_parallel_degrees=[1])}))
    assert flat.config.mesh.pp == 1
    assert plan.prediction.tokens_per_s_per_gpu > flat.prediction.tokens_per_s_per_gpu
    # The losers' table explains the pipeline degrees like the tp ones.
    assert any(word.startswith("pp") for f in plan.rejected for word in f.family.split())


def test_a_pipeline_on_two_nodes_of_a_small_model_loses_to_its_bubble() -> None:
    request = make_request(
        "llama3-8b", "2x8xH100", seq_len=8192, sequences=64,
        search=SearchSpace(pipeline_parallel_degrees=[1, 2], pipeline_schedules=["1F1B"]),
    )
    plan = make_plan(request)
    assert plan.config.mesh.pp == 1
    # The row of the fastest pp=2 configuration (labelled with its whole mesh).
    pp2 = max((f for f in plan.rejected if {"pp2", "tp1"} <= set(f.family.split())),
              key=lambda f: f.best_tokens_per_s_per_gpu or 0.0)
    assert "pipeline bubble" in pp2.reason


def test_pins_plan_the_degree_and_schedule_asked_for() -> None:
    request = make_request(
        "llama3-8b", "2x8xH100", seq_len=8192, sequences=64,
        search=SearchSpace(pipeline_parallel_degrees=[2], pipeline_schedules=["1F1B"]),
    )
    plan = make_plan(request)
    assert plan.config.mesh.pp == 2
    assert plan.config.pipeline is not None and plan.config.pipeline.schedule == "1F1B"
    assert plan.config.grad_accum_steps >= 2
    assert all(c.config.pipeline.schedule == "1F1B" for c in plan.alternatives)


def test_single_nodes_search_no_pipeline_and_multi_node_clusters_do() -> None:
    def degrees(cluster: str) -> list[int]:
        return pipeline_parallel_degrees(make_request("llama3-8b", cluster, seq_len=8192, sequences=8))

    assert degrees("1x8xH100") == [1]
    assert degrees("4x8xH100") == [1, 2, 4]
    assert degrees("6x8xH100") == [1, 2]


@pytest.mark.parametrize(
    ("model", "cluster", "pin", "message"),
    [
        ("llama-debug", "1x8xH100", 16, "16 stages need at least 16 blocks, the model has"),
        ("llama3-8b", "1x6xH100", 4, "4 stages do not divide the cluster's 6 GPUs"),
    ],
)
def test_pins_the_model_or_cluster_cannot_take_are_refused(model, cluster, pin, message) -> None:
    request = make_request(model, cluster, seq_len=1024, sequences=48,
                           search=SearchSpace(pipeline_parallel_degrees=[pin]))
    with pytest.raises(PlanningError, match=message) as caught:
        make_plan(request)
    assert caught.value.field == "search.pipeline_parallel_degrees"


def test_a_pipeline_config_that_does_not_fit_the_request_is_refused() -> None:
    request = make_request("llama3-8b", "2x8xH100", seq_len=8192, sequences=64)
    base = make_plan(request).config
    wrong = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(10, 10))  # 20 of 32 blocks
    with pytest.raises(PlanningError, match="places 20 blocks, the model has 32"):
        predict(request, _pipelined(request, base, pp=2, pipeline=wrong))
    with pytest.raises(PipelineError, match="at least 2"):
        replace(_pipelined(request, base, pp=2, pipeline=wrong), grad_accum_steps=1, micro_batch_size=32)


def test_zero_bubble_schedules_are_eager_only() -> None:
    request = make_request("llama3-8b", "2x8xH100", seq_len=8192, sequences=64,
                           search=SearchSpace(pipeline_parallel_degrees=[2]))
    base = make_plan(request).config
    zbv = PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=2, stage_blocks=(8, 8, 8, 8))
    with pytest.raises(PipelineError, match="use 1F1B or Interleaved1F1B with compile"):
        replace(_pipelined(request, base, pp=2, pipeline=zbv), compile=True)
    setting = build_setting(request, None, None)
    choices = [c for c in enumerate_choices(request, setting) if c.pipeline is not None]
    assert choices and all(c.pipeline.schedule != "ZBVZeroBubble" for c in choices if c.compile)
    assert any(c.pipeline.schedule == "ZBVZeroBubble" for c in choices if not c.compile)


@pytest.mark.parametrize(
    ("search", "message"),
    [
        (
            {"pipeline_parallel_degrees": [4], "pipeline_schedules": ["ZBVZeroBubble"],
             "tensor_parallel_degrees": [1]},
            "pp=4 with ZBVZeroBubble needs at least 8 stages of a block each, the model has 4 blocks",
        ),
        (
            {"pipeline_parallel_degrees": [2], "pipeline_schedules": ["ZBVZeroBubble"], "compile": [True]},
            "ZBVZeroBubble runs only stages that are not compiled, and search.compile allows compiled",
        ),
    ],
)
def test_pins_that_leave_nothing_to_plan_are_refused(search: dict, message: str) -> None:
    # Were assertion errors (500s in the API): nothing was enumerated to price, or to advise on.
    request = make_request("llama-debug", "1x8xcpu", seq_len=256, sequences=64, search=SearchSpace(**search))
    with pytest.raises(PlanningError, match=message) as caught:
        make_plan(request)
    assert caught.value.field.startswith("search.pipeline_")


def test_pipelines_and_context_parallelism_are_planned_together() -> None:
    # The runtime runs cp inside each pipeline stage (torchtitan's 4-D composition): the search
    # enumerates pp x cp meshes, pins of both plan, and the project's engine prices them.
    search = SearchSpace(pipeline_parallel_degrees=[1, 2], context_parallel_degrees=[1, 2])
    request = make_request("llama3-8b", "4x8xH100", seq_len=65536, sequences=8, search=search)
    setting = build_setting(request, None, None)
    meshes = {(c.mesh.pp, c.mesh.cp) for c in enumerate_choices(request, setting)}
    assert meshes == {(1, 1), (1, 2), (2, 1), (2, 2)}
    plan = make_plan(request)
    pinned = make_plan(request.model_copy(update={"search": SearchSpace(
        pipeline_parallel_degrees=[2], context_parallel_degrees=[2])}))
    assert (pinned.config.mesh.pp, pinned.config.mesh.cp) == (2, 2)
    assert pinned.prediction.tokens_per_s_per_gpu <= plan.prediction.tokens_per_s_per_gpu
    pipeline = PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(16, 16))
    both = replace(plan.config, sharding="full_shard", mesh=Mesh(pp=2, dp_shard=4, cp=2, tp=2),
                   pipeline=pipeline, micro_batch_size=1, grad_accum_steps=2, float8="none", async_tp=False)
    ours = predict(request, both)
    titan = predict(request, replace(both, engine="torchtitan", loss="autograd_fp32"))
    assert ours.config.mesh.cp == titan.config.mesh.cp == 2
    # The same mesh and schedule; torchtitan's whole fp32 loss holds more memory.
    assert ours.prediction.peak_memory_gib < titan.prediction.peak_memory_gib


def test_a_batch_too_small_for_a_pinned_pipeline_is_refused_with_a_batch_that_plans() -> None:
    # Was an assertion error (a 500): the advice probed batches that no pipeline could split.
    request = make_request("llama-debug", "1x8xcpu", seq_len=256, sequences=3,
                           search=SearchSpace(pipeline_parallel_degrees=[4]))
    with pytest.raises(PlanningError) as caught:
        make_plan(request)
    assert caught.value.field == "training.global_batch_tokens"
    message = caught.value.message
    assert "a pipeline of pp stages leaves 1/pp of them, each taking at least pp sequences" in message
    assert "e.g. 4 sequences = 1024 tokens (split over 1 data-parallel rank at pp=4 tp=2)" in message
    suggested = make_request("llama-debug", "1x8xcpu", seq_len=256, sequences=4,
                             search=SearchSpace(pipeline_parallel_degrees=[4]))
    assert make_plan(suggested).config.mesh.pp == 4
