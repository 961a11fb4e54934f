"""Property tests over random valid specs: no crash, monotone memory, sharding never adds state."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.mesh import Mesh
from planner.cost.estimate import Estimator
from planner.cost.setting import Choice
from planner.errors import InfeasiblePlanError
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    architecture = draw(st.sampled_from(["llama", "gpt2"]))
    model = ModelSpec(
        name="random",
        architecture=architecture,
        vocab_size=draw(st.integers(256, 200_000)),
        hidden_size=heads * head_dim,
        num_layers=draw(st.integers(1, 48)),
        num_heads=heads,
        num_kv_heads=kv_heads if architecture == "llama" else None,
        intermediate_size=draw(st.integers(64, 30_000)),
        tie_word_embeddings=draw(st.booleans()),
        # GPT-2's positions are a learned table: every drawn seq_len must fit in it.
        max_seq_len=8192,
    )
    nodes = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    seq_len = draw(st.sampled_from([128, 512, 2048, 8192]))
    per_rank = draw(st.integers(1, 8))
    return PlanRequest(
        model=model,
        cluster=ClusterSpec(
            num_nodes=nodes, gpus_per_node=gpus, gpu=draw(st.sampled_from(["H100", "A100-40GB", "L4", "cpu"]))
        ),
        training=TrainingSpec(
            seq_len=seq_len,
            global_batch_tokens=seq_len * per_rank * nodes * gpus,
            precision=draw(st.sampled_from(["bf16", "fp32"])),
        ),
        top_k=3,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_planning_never_crashes_and_respects_memory(request: PlanRequest) -> None:
    try:
        plan = make_plan(request)
    except InfeasiblePlanError as exc:
        assert exc.min_peak_memory_gib > exc.capacity_gib
        return
    usable = plan.cluster.gpu_spec.memory_gib * (1 - request.search.memory_headroom)
    assert plan.prediction.peak_memory_gib <= usable
    assert plan.prediction.step_time_s > 0 and plan.prediction.tokens_per_s_per_gpu > 0
    config = plan.config
    assert config.micro_batch_size * config.grad_accum_steps * config.mesh.dp == (
        request.training.global_batch_sequences
    )


@settings(max_examples=60, deadline=None)
@given(requests(), st.sampled_from(["none", "selective", "op_selective", "full"]), st.booleans())
def test_memory_is_monotone_in_micro_batch(request: PlanRequest, checkpointing: str, compiled: bool) -> None:
    estimator = Estimator(build_setting(request))
    world = request.cluster.world_size
    totals = [
        estimator.memory(
            Choice(
                sharding="full_shard", mesh=Mesh(dp_shard=world), checkpointing=checkpointing,
                every_k=2, micro_batch_size=mb, compile=compiled,
            )
        ).total
        for mb in (1, 2, 4, 8)
    ]
    assert totals == sorted(totals)


@settings(max_examples=60, deadline=None)
@given(requests())
def test_more_sharding_never_increases_sharded_state(request: PlanRequest) -> None:
    estimator = Estimator(build_setting(request))
    world = request.cluster.world_size
    states = []
    for shard in sorted({1, *(s for s in (2, 4, 8, 16, 32) if world % s == 0 and s <= world), world}):
        sharding = "no_shard" if shard == 1 else ("full_shard" if shard == world else "hybrid_shard")
        mesh = Mesh(dp_replicate=world // shard, dp_shard=shard)
        choice = Choice(sharding=sharding, mesh=mesh, checkpointing="full")
        states.append(estimator.memory(choice).sharded_states)
    assert states == sorted(states, reverse=True)
