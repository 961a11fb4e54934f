"""Pure bf16 training (`training.state_dtype` bfloat16): parameters, gradients and AdamW's states in bf16,
no fp32 master, priced and planned; mixed precision (the default) plans as before."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from planner.cost.estimate import Estimator
from planner.cost.memory import sharded_states
from planner.cost.setting import Choice
from planner.errors import PlanningError
from planner.fidelity.pricing import run_request
from planner.fidelity.schema import Run, load_corpus
from planner.search import make_plan, predict
from planner.search_setting import build_setting
from planner.specs import TrainingSpec
from tests.planner.conftest import make_request


def _pure(request):
    return request.model_copy(
        update={"training": request.training.model_copy(update={"state_dtype": "bfloat16"})}
    )


def test_states_take_2_2_4_bytes_per_parameter_instead_of_4_4_8() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=8)
    choice = Choice(sharding="full_shard", mesh=make_plan(request).config.mesh)
    mixed, pure = build_setting(request), build_setting(_pure(request))
    n = mixed.model.rank_params / choice.mesh.dp_shard
    assert sharded_states(mixed, choice) == pytest.approx((4 * n, 4 * n, 8 * n))
    assert sharded_states(pure, choice) == pytest.approx((2 * n, 2 * n, 4 * n))
    # The update reads and writes half the bytes; gradients are reduced in bf16.
    mixed_time, pure_time = Estimator(mixed).timing(choice), Estimator(pure).timing(choice)
    assert pure_time.optimizer_s < 0.6 * mixed_time.optimizer_s
    assert pure.reduce_dtype == "bfloat16" and mixed.reduce_dtype == "float32"


def test_an_8b_model_refused_on_one_h200_fits_in_pure_bf16() -> None:
    # The run: an 8B model trained on one H200 in pure bf16. Mixed precision needs 16 bytes
    # per parameter for its states alone (the planner refuses: "needs 152.8 GiB").
    request = make_request("llama3-8b", "1x1xH200", seq_len=4096, sequences=2)
    with pytest.raises(PlanningError, match=r"needs 152\.8 GiB"):
        make_plan(request)
    plan = make_plan(_pure(request))
    breakdown = plan.prediction.memory_breakdown_gib
    params = plan.model.num_params
    assert breakdown.params == pytest.approx(2 * params / 2**30, rel=1e-6)
    assert breakdown.optimizer >= 4 * params / 2**30
    assert plan.prediction.peak_memory_gib < plan.prediction.usable_memory_gib
    assert plan.config.reduce_dtype == "bfloat16" and plan.config.param_dtype == "bfloat16"
    assert plan.training.state_dtype == "bfloat16"
    assert plan.model_dump(mode="json")["training"]["state_dtype"] == "bfloat16"


def test_mixed_precision_plans_and_hashes_as_before() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=8)
    assert "state_dtype" not in request.model_dump(mode="json")["training"]
    explicit = request.model_copy(
        update={"training": request.training.model_copy(update={"state_dtype": "float32"})}
    )
    plan = make_plan(request)
    assert make_plan(explicit).plan_hash == plan.plan_hash
    assert "state_dtype" not in plan.model_dump(mode="json")["training"]
    assert plan.config.reduce_dtype == "float32"
    # The same configuration priced in pure bf16 holds less and steps no slower.
    pure = predict(_pure(request), replace(plan.config, reduce_dtype="bfloat16")).prediction
    assert pure.peak_memory_gib < plan.prediction.peak_memory_gib
    assert pure.step_time_s <= plan.prediction.step_time_s


def test_pure_bf16_needs_bf16_compute() -> None:
    with pytest.raises(ValidationError, match=r"needs precision bf16") as refused:
        TrainingSpec(seq_len=8, global_batch_tokens=16, precision="fp32", state_dtype="bfloat16")
    assert refused.value.errors()[0]["loc"] == ("state_dtype",)


def test_the_corpus_states_a_pure_bf16_run_and_prices_it_so() -> None:
    run = next(r for f in load_corpus() for r in f.runs if r.priceable and r.config.precision == "bf16")
    document = run.model_dump(mode="json")
    document["config"]["master_dtype"] = "bf16"
    pure = Run.model_validate(document)
    assert run_request(pure).training.state_dtype == "bfloat16"
    assert run_request(run).training.state_dtype == "float32"
    document["config"]["precision"] = "fp32"
    with pytest.raises(ValidationError, match=r"config\.master_dtype"):
        Run.model_validate(document)
