"""A mixture of experts that cannot fit because the request pinned expert parallelism too low is
refused with advice that names ep, in the reason and in the remedy."""

from __future__ import annotations

import pytest

from planner.errors import InfeasiblePlanError
from planner.search import make_plan
from planner.specs import SearchSpace
from tests.planner.conftest import make_request


def test_the_remedy_of_a_pinned_ep_names_the_degree_the_experts_allow() -> None:
    request = make_request(
        "deepseek-v3", "32x8xH100", seq_len=4096, sequences=4096,
        search=SearchSpace(
            expert_parallel_degrees=[1], tensor_parallel_degrees=[1], pipeline_parallel_degrees=[1]
        ),
    )
    with pytest.raises(InfeasiblePlanError) as refused:
        make_plan(request)
    message = str(refused.value)
    assert "--ep 256 holds 1/256 of the routed experts per rank" in message  # why: gathered blocks
    assert (  # what would fit: the remedy names ep before the sequence splits
        "It needs expert parallelism beyond ep=1 (up to ep=256 splits its 256 routed experts, each rank "
        "gathering only its own; widen search.expert_parallel_degrees), tensor parallelism beyond tp=1"
    ) in message


def test_a_dense_refusal_names_no_expert_parallelism() -> None:
    request = make_request(
        "llama3.1-405b", "1x8xH100", seq_len=8192, sequences=64,
        search=SearchSpace(tensor_parallel_degrees=[1]),
    )
    with pytest.raises(InfeasiblePlanError) as refused:
        make_plan(request)
    assert "expert parallelism" not in str(refused.value)


def test_a_refusal_held_up_by_fp32_states_says_pure_bf16_fits_here() -> None:
    request = make_request("qwen3-30b-a3b", "1x8xH100", seq_len=4096, sequences=256)
    with pytest.raises(InfeasiblePlanError) as refused:
        make_plan(request)
    assert str(refused.value).endswith(
        "Pure bf16 training fits it here: with training.state_dtype bfloat16 the parameters, gradients and "
        "optimizer states are kept in bf16, with no fp32 master copy (the lightest configuration: "
        "full_shard dp8x1 ep8 tp1 u1 AC=full mb1x32 eager, 36.5 GiB per GPU)."
    )
    assert "Pure bf16 training fits it here" in (refused.value.advice or "")
    # And it does: the same request in pure bf16 plans on the same node.
    pure = request.model_copy(
        update={"training": request.training.model_copy(update={"state_dtype": "bfloat16"})}
    )
    assert make_plan(pure).config.mesh.world_size == 8


def test_no_pure_bf16_advice_where_half_the_states_still_do_not_fit() -> None:
    request = make_request("llama3-70b", "1x8xH100", seq_len=4096, sequences=256)
    with pytest.raises(InfeasiblePlanError) as refused:
        make_plan(request)
    assert "Pure bf16" not in str(refused.value)
