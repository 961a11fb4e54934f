"""The `torchtitan` launch target for teams pinned to torchtitan 0.2.x: the job config as 0.2.x's TOML
(`--torchtitan-version 0.2`), built as data and dumped by a TOML library. The TOML is read back and every
mapped field checked against the plan, and every key against 0.2.x's JobConfig dataclasses (0.2.x is not
installed beside 0.3.0, so its field names are quoted here from its source)."""

from __future__ import annotations

import base64
import dataclasses
import io
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from contract.mesh import AXES
from executor.launch.bundle import PodOptions, bundle_files, bundle_name, write_bundle
from executor.launch.quoting import UnsafeValueError
from executor.launch.torchtitan import JOB_TOML, mapping
from planner.plan import Plan
from tests.executor.launch_lint import documents, validate_manifest
from tests.executor.torchtitan_plans import moe_plan, plan_for

# torchtitan 0.2.x's job config: the fields of each JobConfig section the bundle may write, as
# torchtitan/config/job_config.py declares them at tag v0.2.2 (commit
# 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce; v0.2.0 and v0.2.1 declare the same for these sections,
# v0.2.0's Training without `dataloader`).
JOB_CONFIG_02: dict[str, set[str]] = {
    "job": {
        "config_file", "dump_folder", "description", "print_config", "save_config_file",
        "custom_config_module",
    },
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"},
    "training": {
        "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
        "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
        "gc_debug", "dataloader",
    },
    "parallelism": {
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
        "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
        "context_parallel_load_balancer", "context_parallel_rotate_method", "expert_parallel_degree",
        "expert_tensor_parallel_degree", "expert_parallel_comm_backend",
    },
    "activation_checkpoint": {
        "mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
        "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state", "determinism_check", "debug",
    },
    "compile": {"enable", "components", "backend"},
    "quantize": {"linear", "grouped_mm"},
    "quantize.linear": {"float8", "mx"},
    "quantize.linear.float8": {
        "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
        "filter_fqns", "emulate",
    },
    "quantize.linear.mx": {"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"},
}
# The choices 0.2.2 declares as Literal (or documents): AC modes, Float8 recipes, reshard policies, and the
# model converters it registers (torchtitan/components/quantization/float8.py and mx.py).
AC_MODES_02 = {"selective", "full", "memory_budget", "none"}
FLOAT8_RECIPES_02 = {"tensorwise", "rowwise", "rowwise_with_gw_hp"}
RESHARD_02 = {"default", "always", "never"}
CONVERTERS_02 = {
    "quantize.linear.float8", "quantize.grouped_mm.float8", "quantize.linear.mx", "quantize.grouped_mm.mx",
}
HEAD_02 = "output"  # the llama3 model's output head in 0.2.x (torchtitan/models/llama3/model/model.py)


def job_config(plan: Plan) -> dict[str, Any]:
    files = {f.path: f.data for f in bundle_files(plan, target="torchtitan", torchtitan_version="0.2")}
    assert f"{JOB_TOML}" in files and "fsdp_planner_job.py" not in files
    return tomllib.loads(files[JOB_TOML].decode())


def check_keys(doc: dict[str, Any], section: str = "") -> None:
    """Every key of the TOML is a field of 0.2.x's JobConfig section it sits in."""
    for key, value in doc.items():
        if not section:
            assert key in JOB_CONFIG_02, f"[{key}] is no section of 0.2.x's JobConfig"
        else:
            assert key in JOB_CONFIG_02[section], f"{section}.{key} is no field of 0.2.x's JobConfig"
        if isinstance(value, dict):
            check_keys(value, f"{section}.{key}" if section else key)


def check_mapped(doc: dict[str, Any], plan: Plan) -> None:
    """Every field the target maps equals the plan's."""
    check_keys(doc)
    planned = plan.config
    parallelism, training = doc["parallelism"], doc["training"]
    for axis in AXES:
        if axis.torchtitan_degree:
            assert parallelism[axis.torchtitan_degree] == planned.mesh.degree(axis.name), axis
    reshard = "always" if planned.reshard_after_forward else "never"
    assert parallelism["fsdp_reshard_after_forward"] == reshard
    assert parallelism["fsdp_reshard_after_forward"] in RESHARD_02
    assert parallelism["enable_async_tensor_parallel"] is planned.async_tp
    accumulation = planned.grad_accum_steps
    if planned.pipeline is not None:
        assert parallelism["pipeline_parallel_schedule"] == planned.pipeline.schedule
        assert parallelism["pipeline_parallel_microbatch_size"] == planned.micro_batch_size
        stages = parallelism["module_fqns_per_model_part"]
        assert [sum(name.startswith("layers.") for name in stage) for stage in stages] \
            == list(planned.pipeline.stage_blocks)
        assert stages[0][0] == "tok_embeddings" and stages[-1][-2:] == ["norm", HEAD_02]
        assert training["local_batch_size"] // planned.micro_batch_size == accumulation
    else:
        assert "module_fqns_per_model_part" not in parallelism
        assert training["local_batch_size"] == planned.micro_batch_size
        dp = planned.mesh.dp
        assert training["global_batch_size"] // (training["local_batch_size"] * dp) == accumulation
    assert training["global_batch_size"] == plan.training.global_batch_sequences
    assert training["seq_len"] == plan.training.seq_len
    assert training["mixed_precision_param"] == planned.param_dtype
    assert training["mixed_precision_reduce"] == "float32"
    assert training["dtype"] == ("bfloat16" if plan.training.state_dtype == "bfloat16" else "float32")
    assert doc["compile"]["enable"] is planned.compile
    ac = doc["activation_checkpoint"]
    assert ac["mode"] in AC_MODES_02
    policy = planned.checkpointing
    if policy.mode == "none":
        assert ac == {"mode": "none"}
    elif policy.mode == "op_selective":
        assert ac == {"mode": "selective", "selective_ac_option": "op"}
    elif policy.mode == "selective" and policy.every_k > 1:
        assert ac == {"mode": "selective", "selective_ac_option": str(policy.every_k)}
    else:
        assert ac == {"mode": "full"}
    converters = doc["model"]["converters"]
    assert set(converters) <= CONVERTERS_02
    if planned.float8 == "none":
        assert converters == [] and "quantize" not in doc
    elif planned.float8 == "mxfp8":
        assert converters == ["quantize.linear.mx"]
        assert doc["quantize"]["linear"]["mx"]["filter_fqns"] == [HEAD_02]  # the head stays in bf16
    else:
        assert converters == ["quantize.linear.float8"]
        float8 = doc["quantize"]["linear"]["float8"]
        assert float8["recipe_name"] == planned.float8 and float8["recipe_name"] in FLOAT8_RECIPES_02
        assert float8["filter_fqns"] == [HEAD_02]


def test_a_llama3_8b_plan_as_0_2_toml(plan_8b: Plan) -> None:
    doc = job_config(plan_8b)
    assert doc["model"]["name"] == "llama3" and doc["model"]["flavor"] == "8B"
    check_mapped(doc, plan_8b)


def test_a_70b_tp_pp_plan_as_0_2_toml(plan_70b: Plan) -> None:
    doc = job_config(plan_70b)
    assert doc["model"]["flavor"] == "70B"
    check_mapped(doc, plan_70b)


@pytest.mark.parametrize("checkpointing", [
    {"mode": "none"}, {"mode": "full"}, {"mode": "op_selective"}, {"mode": "selective", "every_k": 2},
])
@pytest.mark.parametrize("float8", ["none", "tensorwise", "rowwise"])
def test_each_checkpointing_policy_float8_recipe_and_cp(
    plan_8b: Plan, checkpointing: dict, float8: str,
) -> None:
    config = dataclasses.replace(
        plan_8b.config,
        checkpointing=dataclasses.replace(plan_8b.config.checkpointing, **checkpointing),
        mesh=dataclasses.replace(plan_8b.config.mesh, cp=2, dp_shard=plan_8b.config.mesh.dp_shard // 2),
        micro_batch_size=plan_8b.config.micro_batch_size * 2,
        float8=float8,
    )
    plan = plan_8b.model_copy(update={"config": config})
    check_mapped(job_config(plan), plan)
    job = mapping(plan, "0.2")
    # 0.2.x checkpoints every k-th block and has the tensorwise recipe: neither is listed as missing, and
    # the configuration re-priced keeps them.
    assert not any("-th block" in line or "tensorwise" in line for line in job.not_expressed)
    assert job.config.checkpointing == config.checkpointing or checkpointing["mode"] == "full"
    assert job.config.float8 == float8


def test_mxfp8_as_0_2_toml() -> None:
    b200 = plan_for("llama3-8b", "1x8xb200", sequences=64)
    plan = b200.model_copy(update={"config": dataclasses.replace(b200.config, float8="mxfp8")})
    check_mapped(job_config(plan), plan)


def test_the_0_2_bundle_launches_the_toml_and_its_manifests_pass_the_schemas(
    plan_70b: Plan, tmp_path: Path,
) -> None:
    write_bundle(
        plan_70b, tmp_path, target="torchtitan", torchtitan_version="0.2", pods=PodOptions(queue="team-a")
    )
    directory = tmp_path / bundle_name(plan_70b)
    launch = (directory / "launch.sh").read_text()
    assert f'ARGS=(--job.config_file "$HERE/{JOB_TOML}")' in launch
    assert '-m torchtitan.train "${ARGS[@]}" "$@"' in launch and "torchtitan==0.2.2" in launch
    for name in ("k8s.yaml", "k8s-pytorchjob.yaml"):
        validate_manifest(directory / name)
        config_map = documents((directory / name).read_text())["ConfigMap"]
        archive = base64.b64decode(config_map["binaryData"]["bundle.tar.gz"])
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            carried = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        assert carried["launch.sh"].decode() == launch
        assert carried[JOB_TOML] == (directory / JOB_TOML).read_bytes()
    readme = " ".join((directory / "README.md").read_text().split())
    assert "torchtitan 0.2.2 job" in readme and f"--job.config_file {JOB_TOML}" in readme
    assert "--model.hf_assets_path" in readme and "## What torchtitan cannot express" in readme
    assert "FSDP units of" in readme  # what 0.2.x cannot express is listed as on 0.3


def test_the_0_2_loss_is_the_whole_micro_batch(plan_8b: Plan) -> None:
    plan = plan_8b.model_copy(update={"config": dataclasses.replace(plan_8b.config, loss_chunks=4)})
    job = mapping(plan, "0.2")
    assert job.config.loss in ("autograd_fp32", "compiled_fp32") and job.config.loss_chunks == 1
    assert any("the loss over 4 slices" in line for line in job.not_expressed)
    assert mapping(plan, "0.3").config.loss_chunks == 4


def test_an_moe_plan_keeps_tp_inside_the_experts_on_0_2() -> None:
    plan = moe_plan("qwen3-30b-a3b", "2x8xh100", ep=4, sequences=256, tensor_parallel_degrees=[2])
    doc = job_config(plan)
    check_mapped(doc, plan)
    assert doc["parallelism"]["expert_tensor_parallel_degree"] == plan.config.mesh.tp
    assert not any("borrows the tp ranks" in line for line in mapping(plan, "0.2").not_expressed)


def test_an_unknown_version_is_refused_naming_the_option(plan_8b: Plan) -> None:
    with pytest.raises(UnsafeValueError, match=r"torchtitan_version '0\.1'") as caught:
        bundle_files(plan_8b, target="torchtitan", torchtitan_version="0.1")
    assert caught.value.field == "torchtitan_version"


def test_the_cli_writes_the_0_2_bundle(plan_8b: Plan, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_8b.model_dump_json())
    out = tmp_path / "out"
    args = ["launcher", "--plan", str(plan_path), "--target", "torchtitan", "--torchtitan-version", "0.2",
            "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / bundle_name(plan_8b) / JOB_TOML).is_file()
    assert "--model.hf_assets_path" in result.output and "torchtitan==0.2.2" in result.output
