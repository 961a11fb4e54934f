"""The expert-parallel all-to-alls' time is reported apart from the tensor-parallel collectives'
(`Prediction.exposed_expert_parallel_s`, schema 2.4): each MoE block's dispatch and combine, forward
and backward, per micro-batch; part of the exposed communication; none in a dense plan; a 2.3
plan (which counted it with tensor parallelism) still reads."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from contract.mesh import Mesh
from contract.plan_document import SCHEMA_VERSION, parse_plan
from planner.cost.estimate import Estimator, expert_parallel_seconds
from planner.cost.setting import Choice
from planner.formatting import duration
from planner.plan import Plan
from planner.search import make_plan
from planner.search_setting import build_setting
from tests.older_schemas import as_schema_2_3
from tests.planner.conftest import make_request
from tests.planner.test_expert_parallel import _request

runner = CliRunner()


def test_each_moe_blocks_all_to_alls_run_forward_and_backward() -> None:
    estimator = Estimator(build_setting(_request("2x8xH100")))
    choice = Choice(sharding="full_shard", mesh=Mesh(dp_shard=16, ep=8), checkpointing="none")
    share = estimator.setting_for(choice)
    moe_blocks = [b for b in share.model.blocks if b.routed_experts]
    tokens = choice.micro_batch_size * share.seq_len
    per_block = expert_parallel_seconds(share, choice, moe_blocks[0], tokens=tokens)
    time = estimator.timing(choice)
    assert per_block > 0
    assert time.expert_parallel_s == pytest.approx(2 * per_block * len(moe_blocks) * choice.grad_accum_steps)
    assert time.tensor_parallel_s == 0  # tp 1, cp 1: nothing else between the matmuls
    assert time.exposed_comm_s >= time.expert_parallel_s


def test_recomputed_blocks_exchange_their_tokens_again() -> None:
    estimator = Estimator(build_setting(_request("2x8xH100")))
    kept = Choice(sharding="full_shard", mesh=Mesh(dp_shard=16, ep=8), checkpointing="none")
    recomputed = Choice(sharding="full_shard", mesh=Mesh(dp_shard=16, ep=8), checkpointing="full")
    assert estimator.timing(recomputed).expert_parallel_s == pytest.approx(
        1.5 * estimator.timing(kept).expert_parallel_s
    )


@pytest.mark.parametrize("sharding", ["full_shard", "shard_grad_op"])
def test_compiled_whole_block_recompute_exchanges_the_tokens_again(sharding: str) -> None:
    # The compiled engine's whole-block policy keeps the FSDP collectives' outputs (with shard_grad_op
    # its gathered parameters too) but runs the token exchange again with the router, as the runtime
    # does (executor/runtime/activation_checkpoint.py `_recompute_all_context`).
    estimator = Estimator(build_setting(_request("2x8xH100")))
    mesh = Mesh(dp_shard=16, ep=8)
    kept = Choice(sharding=sharding, mesh=mesh, checkpointing="none", compile=True)
    recomputed = Choice(sharding=sharding, mesh=mesh, checkpointing="full", compile=True)
    assert recomputed.simple_fsdp and recomputed.checkpoint_policy_saves_communication
    assert estimator.timing(recomputed).expert_parallel_s == pytest.approx(
        1.5 * estimator.timing(kept).expert_parallel_s
    )


def test_an_ep_plan_reports_the_all_to_alls_apart_and_a_dense_plan_none() -> None:
    plan = make_plan(_request("2x8xH100", expert_parallel_degrees=[8], tensor_parallel_degrees=[2]))
    p = plan.prediction
    assert plan.config.mesh.ep == 8 and plan.config.mesh.tp == 2
    assert p.exposed_expert_parallel_s > 0 and p.exposed_tensor_parallel_s > 0
    parts = p.exposed_all_gather_s + p.exposed_reduce_scatter_s + p.exposed_pipeline_p2p_s
    model_parallel = p.exposed_tensor_parallel_s + p.exposed_expert_parallel_s
    assert p.exposed_comm_s == pytest.approx(parts + model_parallel)
    dense = make_plan(make_request("llama-debug", "1x2xcpu", seq_len=128, sequences=8)).prediction
    assert dense.exposed_expert_parallel_s == 0


def test_a_schema_2_3_plan_reads_with_the_all_to_alls_in_tensor_parallel() -> None:
    plan = make_plan(_request("2x8xH100", expert_parallel_degrees=[8]))
    document = plan.model_dump(mode="json")
    assert document["schema_version"] == SCHEMA_VERSION == "2.4"
    older = as_schema_2_3(document)
    assert "exposed_expert_parallel_s" not in older["prediction"]
    read = Plan.model_validate(older).prediction
    assert read.exposed_expert_parallel_s == 0
    assert read.exposed_tensor_parallel_s == pytest.approx(
        plan.prediction.exposed_tensor_parallel_s + plan.prediction.exposed_expert_parallel_s
    )
    assert parse_plan(older).config == parse_plan(document).config


def test_a_pinned_ep_of_one_has_no_all_to_alls() -> None:
    plan = make_plan(_request("1x8xH100", expert_parallel_degrees=[1]))
    assert plan.config.mesh.ep == 1 and plan.prediction.exposed_expert_parallel_s == 0


def test_the_command_line_prints_the_all_to_alls_apart() -> None:
    args = ["plan", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--seq-len", "4096",
            "--global-batch-tokens", "1048576", "--state-dtype", "bfloat16", "--ep", "8"]
    printed = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert printed.exit_code == 0, printed.output
    prediction = json.loads(runner.invoke(app, [*args, "--json"]).output)["prediction"]
    seconds = duration(prediction["exposed_expert_parallel_s"])
    row = rf"expert parallel\s+{re.escape(seconds)}/step of it \(token dispatch and combine"
    assert re.search(row, printed.output)
