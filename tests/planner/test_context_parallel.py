"""Context parallelism in the planner: searched for long sequences, priced (the all-gathered keys and
values, each rank's share of the sequence), explained, and refused where the runtime cannot split."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from contract.mesh import Mesh
from planner.cost.estimate import Estimator, context_parallel_seconds
from planner.cost.setting import Choice
from planner.enumeration import CONTEXT_PARALLEL_FROM_SEQ_LEN, context_parallel_degrees
from planner.errors import PlanningError
from planner.search import make_plan, predict
from planner.search_setting import build_setting
from planner.specs import SearchSpace
from tests.planner.conftest import make_request

LONG = 131072


def test_a_128k_sequence_of_an_8b_model_plans_on_one_node_with_cp() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=LONG, sequences=1)
    plan = make_plan(request)
    mesh = plan.config.mesh
    assert mesh.cp > 1 and mesh.world_size == 8
    assert f"cp{mesh.cp}" in plan.config.label()
    assert plan.prediction.peak_memory_gib < 78.6
    # Without context parallelism one sequence on 8 GPUs can only be split by tp 8, which is slower.
    pinned = make_plan(request.model_copy(update={"search": SearchSpace(context_parallel_degrees=[1])}))
    assert pinned.config.mesh.tp == 8
    assert plan.prediction.tokens_per_s_per_gpu > pinned.prediction.tokens_per_s_per_gpu
    # The losers' table names the cp families like the tp ones.
    assert any(word.startswith("cp") for f in plan.rejected for word in f.family.split())


def test_short_sequences_do_not_search_cp_and_plan_as_before() -> None:
    short = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8)
    assert context_parallel_degrees(short) == [1]
    long = make_request("llama3-8b", "1x8xH100", seq_len=CONTEXT_PARALLEL_FROM_SEQ_LEN, sequences=8)
    assert context_parallel_degrees(long) == [1, 2, 4, 8]
    assert "context_parallel_degrees" not in SearchSpace().model_dump(mode="json")  # hashes as before


def test_cp_divides_each_ranks_activations_and_pays_the_gathered_keys() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=65536, sequences=2)
    setting = build_setting(request, None, None)
    estimator = Estimator(setting)
    alone = Choice(sharding="full_shard", mesh=Mesh(dp_shard=2, tp=4), compile=True, checkpointing="full")
    split = replace(alone, mesh=Mesh(dp_shard=2, cp=2, tp=2))
    share = estimator.setting_for(split)
    assert share.seq_len == 65536 // 2 and share.model.context_parallel == 2
    block = share.model.blocks[0]
    gathered = context_parallel_seconds(share, split, block, tokens=share.seq_len)
    assert gathered > 0 and context_parallel_seconds(share, alone, block, tokens=share.seq_len) == 0
    # Keys and values from the other rank are kept for attention's backward.
    plain = estimator.setting_for(replace(split, mesh=Mesh(dp_shard=2, tp=2, dp_replicate=2)))
    assert block.saved_elems - plain.model.blocks[0].saved_elems == pytest.approx(block.kv_elems)


def test_throughput_counts_the_tokens_a_cp_group_shares() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=LONG, sequences=1)
    plan = make_plan(request)
    p = plan.prediction
    # One sequence per step over 8 GPUs: tokens/s/GPU is the step's tokens over 8 GPUs.
    assert p.tokens_per_s_per_gpu == pytest.approx(LONG / p.step_time_s / 8, rel=1e-6)
    again = predict(request, plan.config)
    assert again.prediction.step_time_s == pytest.approx(p.step_time_s)


@pytest.mark.parametrize(
    ("model", "seq_len", "degrees", "message"),
    [
        ("gpt2", 1024, [2], "context parallelism needs a llama-family model"),
        ("llama3-8b", 32772, [4], "cp=4 cuts every sequence into 2 x cp 4 = 8 load-balanced pieces"),
    ],
)
def test_a_cp_pin_the_model_cannot_take_is_refused(
    model: str, seq_len: int, degrees: list, message: str
) -> None:
    request = make_request(model, "1x8xH100", seq_len=seq_len, sequences=8,
                           search=SearchSpace(context_parallel_degrees=degrees))
    with pytest.raises(PlanningError, match=re.escape(message)) as err:
        make_plan(request)
    assert err.value.field == "search.context_parallel_degrees"


def test_a_fixed_cp_mesh_is_checked() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=LONG, sequences=1)
    config = make_plan(request).config
    broken = replace(config, mesh=Mesh(dp_shard=1, cp=4, tp=1))
    with pytest.raises(PlanningError, match="must equal the cluster's 8 GPUs"):
        predict(request, broken)
