"""Mixture-of-experts models plan end to end (without expert parallelism: experts sharded by FSDP like
every parameter, tensor parallelism splitting each expert's matmuls like a dense MLP's)."""

from __future__ import annotations

from planner.search import make_plan
from planner.specs import PlanRequest, TrainingSpec
from tests.planner.conftest import make_request


def test_deepseek_v3_plans_on_256_h100s_with_mfu_over_active_weights() -> None:
    request = make_request("deepseek-v3", "32x8xH100", seq_len=4096, sequences=4096)
    plan = make_plan(request)
    assert 660e9 < plan.model.num_params < 680e9
    assert plan.model.active_params is not None and 36e9 < plan.model.active_params < 38e9
    # 6 x ~37B active parameters per token (and attention), not 6 x 671B.
    assert plan.model.flops_per_token < 6.0 * 50e9
    assert 0.0 < plan.prediction.mfu < 0.6


def test_qwen3_30b_a3b_plans_on_one_h100_node_in_pure_bf16() -> None:
    request = make_request("qwen3-30b-a3b", "1x8xH100", seq_len=4096, sequences=256)
    training = TrainingSpec(
        seq_len=4096, global_batch_tokens=1048576, precision="bf16", state_dtype="bfloat16"
    )
    plan = make_plan(PlanRequest(model=request.model, cluster=request.cluster, training=training))
    assert plan.prediction.peak_memory_gib < 80
