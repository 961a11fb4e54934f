"""Float8 and a mixture of experts: the routed experts' grouped GEMMs are priced in bf16 under every
recipe (the trainer converts linear layers only; torchao's grouped kernels, `GROUPED_GEMM_KERNELS`,
are a prototype no trainer here applies), and the plan says so with the share of the matmul work
they are; a dense Float8 plan and a bf16 MoE plan carry no such warning."""

from __future__ import annotations

import pytest

from contract.float8 import GROUPED_GEMM_KERNELS
from planner.cost.model_costs import float8_share, model_costs
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import SearchSpace
from tests.older_schemas import as_schema_2_3
from tests.planner.conftest import make_request

QWEN3_MOE = ("qwen3-30b-a3b", "2x8xH100")


def _plan(model: str, cluster: str, recipe: str) -> Plan:
    float8 = None if recipe == "none" else [recipe]
    search = SearchSpace(float8=float8)
    return make_plan(make_request(model, cluster, seq_len=4096, sequences=64, search=search))


def _warning(plan: Plan) -> str | None:
    return next((w.message for w in plan.warnings if w.code == "float8_experts_in_bf16"), None)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_a_float8_moe_plan_prices_its_experts_in_bf16_and_says_so(recipe: str) -> None:
    plan = _plan(*QWEN3_MOE, recipe)
    assert plan.config.float8 == recipe
    message = _warning(plan)
    assert message is not None
    costs = model_costs(plan.model, 4096)
    block = next(b for b in costs.blocks if b.routed_experts)
    share = block.expert_matmul_params / block.matmul_params
    assert f"grouped GEMMs, {share:.0%} of the blocks' matmul work per token, run in bf16" in message
    # The converted share leaves the experts out: at most the dense linears'.
    assert float8_share(block, recipe).matmul_fraction <= 1 - share + 1e-9
    if recipe in GROUPED_GEMM_KERNELS:
        assert "torchao has a float8 rowwise grouped GEMM" in message and "does not apply yet" in message
    else:
        assert "torchao has no tensorwise grouped GEMM" in message


def test_no_warning_without_experts_or_without_float8() -> None:
    assert _warning(_plan("llama3-8b", "1x8xH100", "rowwise")) is None
    assert _warning(_plan(*QWEN3_MOE, "none")) is None


def test_a_schema_2_3_plan_reads_without_the_warning() -> None:
    plan = _plan(*QWEN3_MOE, "rowwise")
    older = as_schema_2_3(plan.model_dump(mode="json"))
    assert all(w["code"] != "float8_experts_in_bf16" for w in older["warnings"])
    assert Plan.model_validate(older).config == plan.config
