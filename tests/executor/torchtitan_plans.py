"""The plans the torchtitan target's tests render (0.3's config module and 0.2.x's TOML alike): built
once here, and as module fixtures (`plan_8b`, `plan_70b`) by tests/executor/conftest.py."""

from __future__ import annotations

from planner.catalog.models import resolve_model
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec


def plan_for(model: str, cluster: str, *, sequences: int, seq_len: int = 8192, **search: object) -> Plan:
    return make_plan(PlanRequest(
        model=resolve_model(model), cluster=ClusterSpec.parse(cluster),
        training=TrainingSpec(seq_len=seq_len, global_batch_tokens=seq_len * sequences),
        search=SearchSpace(**search),  # type: ignore[arg-type]
    ))




def moe_plan(
    model: str, cluster: str, *, ep: int, sequences: int, seq_len: int = 4096, **search: object
) -> Plan:
    """An MoE plan with its expert-parallel degree pinned (pure bf16 training, so that one node holds
    Qwen3-30B-A3B)."""
    plan = make_plan(PlanRequest(
        model=resolve_model(model), cluster=ClusterSpec.parse(cluster),
        training=TrainingSpec(
            seq_len=seq_len, global_batch_tokens=seq_len * sequences, state_dtype="bfloat16"
        ),
        search=SearchSpace(expert_parallel_degrees=[ep], **search),  # type: ignore[arg-type]
    ))
    assert plan.config.mesh.ep == ep
    return plan


def llama3_8b_plan() -> Plan:
    """llama3-8b on one node of 8 H100s."""
    return plan_for("llama3-8b", "1x8xh100", sequences=64)


def llama3_70b_tp_pp_plan() -> Plan:
    """llama3-70b on 8 nodes of 8 H100s with tp 8 and pp 4 pinned."""
    plan = plan_for(
        "llama3-70b", "8x8xh100", sequences=256, tensor_parallel_degrees=[8], pipeline_parallel_degrees=[4]
    )
    assert plan.config.mesh.tp == 8 and plan.config.mesh.pp == 4 and plan.config.pipeline is not None
    return plan
