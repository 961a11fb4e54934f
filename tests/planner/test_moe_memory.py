"""A mixture-of-experts plan's peak memory split into routed experts, dispatch buffers and dense parts
(planner/cost/expert_memory.py, `Prediction.expert_memory_gib`, schema 2.3)."""

from __future__ import annotations

import pytest

from contract.model_config import MoeConfig
from contract.plan_document import SCHEMA_VERSION, parse_plan
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.older_schemas import as_schema_2_2
from tests.planner.conftest import make_request

TINY_MOE = ModelSpec(
    name="tiny-moe", architecture="llama", vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8,
    num_kv_heads=4, intermediate_size=768,
    moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=256, num_shared_experts=1,
                  first_dense_layers=1),
)


def _plan(checkpointing: str) -> Plan:
    return make_plan(PlanRequest(
        model=TINY_MOE, cluster=ClusterSpec.parse("1x2xcpu"),
        training=TrainingSpec(seq_len=128, global_batch_tokens=1024, precision="fp32"),
        search=SearchSpace(checkpointing=[checkpointing]),
    ))


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_parts_add_up_to_the_peak(checkpointing: str) -> None:
    prediction = _plan(checkpointing).prediction
    parts = prediction.expert_memory_gib
    assert parts is not None
    whole = (parts.routed_expert_states + parts.routed_expert_gathered + parts.routed_expert_activations
             + parts.dispatch_buffers + parts.dense_parts)
    assert whole == pytest.approx(prediction.peak_memory_gib, rel=1e-9)
    assert parts.routed_expert_states > 0 and parts.dense_parts > 0
    breakdown = prediction.memory_breakdown_gib
    assert parts.routed_expert_activations + parts.dispatch_buffers <= breakdown.activations * (1 + 1e-9)


def test_routed_rows_are_kept_without_checkpointing() -> None:
    parts = _plan("none").prediction.expert_memory_gib
    assert parts is not None and parts.dispatch_buffers > 0 and parts.routed_expert_activations > 0


def test_dense_plans_have_no_expert_parts() -> None:
    plan = make_plan(make_request("llama-debug", "1x2xcpu", seq_len=128, sequences=8))
    assert plan.prediction.expert_memory_gib is None


def test_a_schema_2_2_plan_reads_without_expert_parts() -> None:
    document = _plan("full").model_dump(mode="json")
    assert document["schema_version"] == SCHEMA_VERSION
    older = as_schema_2_2(document)
    assert "expert_memory_gib" not in older["prediction"]
    assert Plan.model_validate(older).prediction.expert_memory_gib is None
    assert parse_plan(older).config == parse_plan(document).config
