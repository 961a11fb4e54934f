"""The runtime's stdlib reading of the Plan JSON vs the planner's pydantic Plan (the contract)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from pydantic import ValidationError

from contract.fields import FieldError
from contract.model_config import DERIVED_COUNTS, ModelConfig
from contract.parallel_config import ParallelConfig
from contract.plan_document import PlanError, RuntimePlan, parse_plan
from contract.training_config import DERIVED_TRAINING, TrainingConfig
from executor.runtime.models import build_model, count_params
from planner.catalog.models import catalog_model
from planner.cost.model_costs import count_parameters
from planner.plan import Plan, PlannedModel
from planner.search import make_plan
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.executor.plan_factory import debug_plan


def real_plan(model: str = "llama-debug", cluster: str = "1x2xcpu", **search) -> Plan:
    request = PlanRequest(
        model=catalog_model(model),
        cluster=ClusterSpec.parse(cluster),
        training=TrainingSpec(seq_len=64, global_batch_tokens=64 * 16, precision="bf16"),
        search=SearchSpace(**search),
    )
    return make_plan(request)


def assert_same_reading(plan: Plan, runtime: RuntimePlan) -> None:
    """Every field the runtime reads equals the planner's value."""
    for section in ("model", "training", "config"):
        theirs = getattr(plan, section)
        ours = getattr(runtime, section)
        for field in dataclasses.fields(ours):
            value = getattr(ours, field.name)
            if dataclasses.is_dataclass(value):
                for sub in dataclasses.fields(value):
                    assert getattr(value, sub.name) == getattr(getattr(theirs, field.name), sub.name), (
                        f"{section}.{field.name}.{sub.name}"
                    )
            else:
                assert value == getattr(theirs, field.name), f"{section}.{field.name}"
    assert runtime.cluster.ranks == plan.cluster.world_size
    assert runtime.cluster.gpu_spec.peak_bf16_tflops == plan.cluster.gpu_spec.peak_bf16_tflops
    assert runtime.plan_hash == plan.plan_hash
    assert runtime.prediction.step_time_s == plan.prediction.step_time_s


@pytest.mark.parametrize(
    ("model", "cluster", "search"),
    [
        ("llama-debug", "1x2xcpu", {}),
        ("llama-debug", "2x2xcpu", {"shardings": ["hybrid_shard"]}),
        ("llama3-8b", "2x8xH100", {}),
        ("gpt2", "1x8xA100", {"compile": [False], "checkpointing": ["selective"]}),
    ],
)
def test_real_plans_load_in_the_runtime(model: str, cluster: str, search: dict) -> None:
    plan = real_plan(model, cluster, **search)
    runtime = parse_plan(json.loads(plan.model_dump_json()))
    assert_same_reading(plan, runtime)


def test_hand_made_test_plans_are_valid_plans() -> None:
    # plan_factory writes what the executor tests train on: it must be a plan the planner accepts.
    for kwargs in (
        {},
        {"sharding": "hybrid_shard", "nodes": 2},
        {"sharding": "no_shard", "compile": True, "bucket_mb": 64.0, "precision": "bf16"},
        {"checkpointing": "selective", "every_k": 2, "grad_accum_steps": 2},
    ):
        document = debug_plan(**kwargs)
        plan = Plan.model_validate(document)
        assert_same_reading(plan, parse_plan(document))


@pytest.mark.parametrize("name", ["llama-debug", "llama3-8b", "mistral-7b", "gpt2", "gpt2-medium"])
def test_built_models_have_the_parameter_count_the_planner_priced(name: str) -> None:
    spec = catalog_model(name)
    runtime = parse_plan(debug_plan(model=spec.model_dump(mode="json"))).model
    model = build_model(runtime, seq_len=64)  # meta device: no memory even for 8B
    assert count_params(model) == count_parameters(spec)


def test_qwen2_style_qkv_bias_and_tied_llama_counts() -> None:
    for dims in ({"qkv_bias": True}, {"tie_word_embeddings": True}, {"num_kv_heads": None}):
        base = {
            "name": "custom",
            "architecture": "llama",
            "vocab_size": 1000,
            "hidden_size": 128,
            "num_layers": 3,
            "num_heads": 4,
            "num_kv_heads": 2,
            "intermediate_size": 300,
        }
        spec = ModelSpec(**{**base, **dims})
        runtime = parse_plan(debug_plan(model=spec.model_dump(mode="json"))).model
        assert count_params(build_model(runtime, seq_len=32)) == count_parameters(spec), dims


def test_unknown_keys_are_ignored_and_minor_versions_accepted() -> None:
    document = debug_plan()
    document["schema_version"] = "2.7"
    document["brand_new_section"] = {"x": 1}
    document["config"]["future_knob"] = True
    document["model"]["rope_scaling"] = {"type": "yarn"}
    plan = parse_plan(document)
    assert plan.config.sharding == "full_shard" and plan.model.vocab_size == 2048


def test_api_wrapper_is_unwrapped() -> None:
    plan = parse_plan({"id": 7, "name": "x", "plan": debug_plan()})
    assert plan.world_size == 2


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version="3.0"), "reads schema 1.x and 2.x plans, the plan is 3.0"),
        (lambda d: d.pop("schema_version"), "plan.schema_version"),
        (lambda d: d["config"].update(sharding="zero4"), "plan.config.sharding: expected one of"),
        (
            lambda d: d["config"].update(micro_batch_size="2"),
            "plan.config.micro_batch_size: expected an integer",
        ),
        (lambda d: d["config"].update(compile=1), "plan.config.compile: expected true or false"),
        (lambda d: d["model"].pop("vocab_size") and d["model"].pop("name"), "plan.model.name: missing"),
        (lambda d: d["config"].update(grad_accum_steps=3), "global batch is 4"),
        (lambda d: d["config"]["mesh"].update(dp_shard=1), "= 1 ranks, but the cluster has 2"),
        (lambda d: d["config"]["checkpointing"].update(mode="sometimes"), "plan.config.checkpointing.mode"),
    ],
)
def test_bad_plans_fail_with_the_field_named(mutate, message: str) -> None:
    document = copy.deepcopy(debug_plan())
    mutate(document)
    with pytest.raises(PlanError) as err:
        parse_plan(document)
    assert message in str(err.value)


def test_the_configuration_model_and_training_fields_are_declared_once() -> None:
    # The planner's Plan holds the contract's dataclass itself; its model spec takes the contract's
    # fields (a request adds only its layer graph; a plan adds the counts it derives).
    assert Plan.model_fields["config"].annotation is ParallelConfig
    contract_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(ModelSpec.model_fields) == contract_fields - set(DERIVED_COUNTS) | {"layer_graph"}
    assert set(DERIVED_COUNTS) <= set(PlannedModel.model_fields)
    training_fields = {f.name for f in dataclasses.fields(TrainingConfig)}
    assert set(TrainingSpec.model_fields) == training_fields - set(DERIVED_TRAINING)


@pytest.mark.parametrize(
    ("section", "field", "value", "bound"),
    [
        ("config", "blocks_per_unit", 0, "at least 1"),
        ("config", "all_gather_bucket_mb", -1.0, "at least 0"),
        ("config", "loss_chunks", 0, "at least 1"),
        ("model", "num_layers", 0, "at least 1"),
    ],
)
def test_a_contract_bound_holds_in_both_readers(section: str, field: str, value: float, bound: str) -> None:
    document = copy.deepcopy(debug_plan())
    document[section][field] = value
    with pytest.raises(PlanError, match=f"plan.{section}.{field}: must be {bound}"):
        parse_plan(document)
    with pytest.raises(ValidationError, match=f"{section}.{field}\n.*greater than or equal"):
        Plan.model_validate(document)


def test_a_contract_dataclass_checks_itself_however_it_is_made() -> None:
    plan = parse_plan(debug_plan())
    with pytest.raises(FieldError, match="micro_batch_size: must be at least 1, got 0"):
        dataclasses.replace(plan.config, micro_batch_size=0)
    # A whole number given for a float field is stored as a float: the document (and the hash of a
    # fixed configuration) reads the same however the dataclass was built.
    widened = dataclasses.replace(plan.config, all_gather_bucket_mb=64)
    assert widened.as_document()["all_gather_bucket_mb"] == 64.0
    assert isinstance(widened.all_gather_bucket_mb, float)
