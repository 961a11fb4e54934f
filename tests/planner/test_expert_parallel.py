"""Expert parallelism in the planner (issue 40): the `ep` axis carved out of the shard group (not a factor
of the world), searched for mixture-of-experts models, priced (the rank's experts gathered and reduced,
their GEMMs at ep x the rows, the dispatch and combine all-to-alls over the links the group spans),
its memory (expert states over (dp_shard x cp) / ep shards), and taken by this runtime's plan check and
its bundles (the runtime dispatches tokens by all-to-all)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contract.mesh import WORLD_AXES, Mesh, axis, mesh_problems
from contract.model_config import MoeConfig
from contract.plan_document import parse_plan
from executor.launch.bundle import bundle_files
from planner.catalog.models import resolve_model
from planner.cost.estimate import Estimator, _collective, expert_parallel_seconds
from planner.cost.gemm import expert_rows
from planner.cost.memory import sharded_states
from planner.cost.setting import Choice
from planner.enumeration import data_parallel_meshes, expert_parallel_degrees
from planner.errors import InfeasiblePlanError, PlanningError
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.planner.conftest import make_request

TINY_MOE = ModelSpec(
    name="tiny-moe", architecture="llama", vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8,
    num_kv_heads=4, intermediate_size=768,
    moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=256, num_shared_experts=1,
                  first_dense_layers=1),
)


def _request(cluster: str = "1x8xH100", **search: object) -> PlanRequest:
    return PlanRequest(
        model=TINY_MOE, cluster=ClusterSpec.parse(cluster),
        training=TrainingSpec(seq_len=512, global_batch_tokens=512 * 16),
        search=SearchSpace(**search),
    )


def test_ep_is_carved_out_of_the_shard_group() -> None:
    mesh = Mesh(dp_shard=32, ep=8, tp=8)
    assert (mesh.world_size, mesh.fsdp_shards, mesh.expert_shards) == (256, 32, 4)
    assert "ep" not in WORLD_AXES and len(mesh.shape) == len(WORLD_AXES)
    assert mesh.label() == "dp32x1 ep8 tp8"
    assert mesh.describe() == "dp_replicate 1 x dp_shard 32 (ep 8) x tp 8 = 256 ranks"
    assert Mesh(dp_shard=8).label() == "dp8x1 tp1"  # ep 1 is not shown
    # An ep group spans ep x tp consecutive ranks: NVLink while they fit in a node.
    assert Mesh(dp_shard=32, ep=2, tp=4).expert_link(8) == "intra"
    assert Mesh(dp_shard=32, ep=4, tp=4).expert_link(8) == "inter"


def test_old_documents_read_and_hash_as_before() -> None:
    assert Mesh.from_document({"dp_shard": 8, "tp": 1}).ep == 1
    config = make_plan(make_request("llama-debug", "1x2xcpu", seq_len=128, sequences=8)).config
    assert config.mesh.ep == 1 and "ep" not in config.hashed_document()["mesh"]  # hashes as before ep
    assert Mesh.from_document({"dp_shard": 8, "ep": 4}).ep == 4


def test_the_rules_ep_must_keep() -> None:
    training = TrainingSpec(seq_len=512, global_batch_tokens=8192)
    assert mesh_problems(Mesh(dp_shard=8, ep=8), TINY_MOE, training) == []
    (problem,) = mesh_problems(Mesh(dp_shard=4, ep=8), TINY_MOE, training)
    assert problem.startswith("config.mesh.ep: ep=8 must divide dp_shard 4 x cp 1 = 4")
    (problem,) = mesh_problems(Mesh(dp_shard=6, ep=3), TINY_MOE, training)
    assert "ep=3 must divide each of num_experts 8" in problem
    (problem,) = mesh_problems(Mesh(dp_shard=8, ep=2), resolve_model("llama-debug"), training)
    assert "ep=2 needs a mixture-of-experts model" in problem


def test_searched_for_moe_models_only() -> None:
    assert expert_parallel_degrees(make_request("llama3-8b", "1x8xH100", seq_len=512, sequences=16)) == [1]
    assert expert_parallel_degrees(_request()) == [1, 2, 4, 8]
    assert expert_parallel_degrees(_request(expert_parallel_degrees=[4])) == [4]
    with pytest.raises(PlanningError, match="ep=3 must divide each of num_experts 8"):
        expert_parallel_degrees(_request(expert_parallel_degrees=[3]))
    # Unpinned, each mesh tries 1 and the largest degree on each link that divides its shard group.
    searched = data_parallel_meshes(_request(), Mesh(tp=2))
    meshes = [mesh for sharding, mesh in searched if sharding == "full_shard"]
    assert [m.ep for m in meshes] == [1, 4]  # dp_shard 4, tp 2: ep 4 x tp 2 fills the node
    pinned = data_parallel_meshes(_request(expert_parallel_degrees=[1, 2, 4]), Mesh(tp=2))
    assert sorted({m.ep for s, m in pinned if s == "full_shard"}) == [1, 2, 4]
    # The option's help (CLI, API schema, dashboard form) says the same, not "every power of two".
    ep = axis("ep")
    for text in (ep.cli_help, ep.search_doc, ep.form_help):
        assert "largest of all" in text and "every power of two" not in text, text


def test_each_rank_computes_its_experts_at_ep_times_the_rows() -> None:
    request = _request()
    estimator = Estimator(build_setting(request))
    alone = Choice(sharding="full_shard", mesh=Mesh(dp_shard=8), checkpointing="none")
    split = replace(alone, mesh=Mesh(dp_shard=8, ep=4))
    whole, share = estimator.setting_for(alone).model, estimator.setting_for(split).model
    moe = next(i for i, b in enumerate(whole.blocks) if b.routed_experts)
    assert share.blocks[moe].routed_experts == whole.blocks[moe].routed_experts // 4
    assert share.blocks[moe].expert_params == whole.blocks[moe].expert_params // 4
    assert share.blocks[0] is whole.blocks[0]  # a dense block is not split
    rows = {m: expert_rows(4096, experts=m.blocks[moe].routed_experts, experts_per_token=2, imbalance=1.0)
            for m in (whole, share)}
    assert rows[share] == 4 * rows[whole]
    # The sharded states hold as much (E/ep experts over shard/ep ranks); the gathered block is smaller.
    assert sum(sharded_states(estimator.setting_for(split), split)) == pytest.approx(
        sum(sharded_states(estimator.setting_for(alone), alone)), rel=1e-6
    )
    assert estimator.memory(split).unsharded_params < estimator.memory(alone).unsharded_params


def test_the_all_to_alls_cross_the_links_the_group_spans() -> None:
    request = _request("2x8xH100")
    setting = build_setting(request)
    estimator = Estimator(setting)
    choice = Choice(sharding="full_shard", mesh=Mesh(dp_shard=16, ep=8), checkpointing="none")
    share = estimator.setting_for(choice)
    block = next(b for b in share.model.blocks if b.routed_experts)
    tokens = 4096
    seconds = expert_parallel_seconds(share, choice, block, tokens=tokens)
    nbytes = tokens * 2 * 256 * share.act_bytes  # tokens x top-k x hidden x act bytes
    assert seconds == pytest.approx(2 * _collective(share.params, "intra", nbytes, 8))  # dispatch + combine
    wide = replace(choice, mesh=Mesh(dp_shard=16, ep=16))
    across = expert_parallel_seconds(estimator.setting_for(wide), wide, block, tokens=tokens)
    assert across > seconds  # 16 ranks span two nodes: the network
    assert expert_parallel_seconds(share, replace(choice, mesh=Mesh(dp_shard=16)), block, tokens=tokens) == 0


def test_deepseek_v3_plans_with_ep_and_its_runtime_takes_it() -> None:
    request = make_request("deepseek-v3", "32x8xH100", seq_len=4096, sequences=4096)
    plan = make_plan(request)
    assert plan.config.mesh.ep > 1 and f"ep{plan.config.mesh.ep}" in plan.config.label()
    parts = plan.prediction.expert_memory_gib
    # The parts are shown apart; under full checkpointing the peak may fall where no block holds its
    # dispatch buffers (at the loss, only the blocks' inputs are kept).
    assert parts is not None and parts.routed_expert_states > 0 and parts.dense_parts > 0
    assert parts.dispatch_buffers >= 0
    # The runtime dispatches tokens by all-to-all (executor/runtime/expert_parallel.py): the plan
    # check and the bundles take ep plans (tests/executor/test_moe_parity.py runs them).
    assert parse_plan(plan.model_dump(mode="json")).config.mesh.ep == plan.config.mesh.ep
    assert any(f.path == "launch.sh" for f in bundle_files(plan, target="torchrun"))


def test_a_refusal_of_gathered_experts_names_ep() -> None:
    request = make_request(
        "deepseek-v3", "32x8xH100", seq_len=4096, sequences=4096,
        search=SearchSpace(expert_parallel_degrees=[1], tensor_parallel_degrees=[1]),
    )
    with pytest.raises(InfeasiblePlanError) as refused:
        make_plan(request)
    advice = "expert parallelism does: --ep 256 holds 1/256 of the routed experts per rank"
    assert advice in str(refused.value)
