"""The `torchtitan` launch target against the real torchtitan 0.3.0 package: a llama3-8b plan and a 70B
TP+PP plan (and a Float8 one) download as bundles whose config module torchtitan builds, with every
mapped field equal to the plan; models torchtitan lacks are refused with why."""

from __future__ import annotations

import ast
import base64
import dataclasses
import importlib
import io
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from contract.mesh import AXES
from executor.launch.bundle import PodOptions, bundle_files, bundle_name, write_bundle
from executor.launch.manifests import unpack_command
from executor.launch.quoting import UnsafeValueError, python_literal
from executor.launch.torchtitan import JOB_FUNCTION, JOB_MODULE, NotOnTorchtitanError, mapping
from planner.plan import Plan
from tests.executor.launch_lint import documents, lint_script, validate_manifest
from tests.executor.torchtitan_plans import moe_plan, plan_for

# The test command installs torchtitan==0.3.0 (scripts/test.sh): these run against the real package.
from torchtitan import trainer  # isort: skip
from torchtitan.components.loss import ChunkedLossWrapper  # isort: skip
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # isort: skip



@pytest.fixture
def job_module(tmp_path: Path) -> Iterator[object]:
    """Writes a plan's torchtitan bundle and imports its config module (as torchtitan's --module does)."""
    loaded: list[Path] = []

    def load(plan: Plan) -> ModuleType:
        write_bundle(plan, tmp_path / str(len(loaded)), target="torchtitan")
        directory = tmp_path / str(len(loaded)) / bundle_name(plan)
        loaded.append(directory)
        sys.path.insert(0, str(directory))
        sys.modules.pop(JOB_MODULE, None)
        return importlib.import_module(JOB_MODULE)

    yield load
    for directory in loaded:
        sys.path.remove(str(directory))
    sys.modules.pop(JOB_MODULE, None)


def check_mapped(config: object, plan: Plan) -> None:
    """Every field the target maps equals the plan's."""
    assert isinstance(config, trainer.Trainer.Config)
    planned = plan.config
    for axis in AXES:
        if axis.torchtitan_degree:
            assert getattr(config.parallelism, axis.torchtitan_degree) == planned.mesh.degree(axis.name), axis
    reshard = "always" if planned.reshard_after_forward else "never"
    assert config.parallelism.fsdp_reshard_after_forward == reshard
    accumulation = planned.grad_accum_steps
    if planned.pipeline is not None:
        assert config.parallelism.pipeline_parallel_schedule == planned.pipeline.schedule
        assert config.parallelism.pipeline_parallel_microbatch_size == planned.micro_batch_size
        stages = config.parallelism.module_fqns_per_model_part
        assert [sum(name.startswith("layers.") for name in stage) for stage in stages] \
            == list(planned.pipeline.stage_blocks)
        # The schedule's micro-batches are the plan's accumulation steps.
        assert config.training.local_batch_size // planned.micro_batch_size == accumulation
    else:
        assert config.training.local_batch_size == planned.micro_batch_size
        dp = planned.mesh.dp
        assert config.training.global_batch_size // (config.training.local_batch_size * dp) == accumulation
    assert config.training.global_batch_size == plan.training.global_batch_sequences
    assert config.training.seq_len == plan.training.seq_len
    assert config.training.mixed_precision_param == planned.param_dtype
    assert config.compile.enable is planned.compile
    assert config.compile.enable_async_tensor_parallel is planned.async_tp
    assert isinstance(config.loss, ChunkedLossWrapper.Config)
    assert config.loss.num_chunks == planned.loss_chunks
    expected_ac = {
        "none": type(None), "op_selective": SelectiveAC.Config, "full": FullAC.Config,
    }.get(planned.checkpointing.mode, FullAC.Config)
    assert type(config.activation_checkpoint) is expected_ac


def test_a_llama3_8b_plan_builds_in_torchtitan(plan_8b: Plan, job_module) -> None:
    config = getattr(job_module(plan_8b), JOB_FUNCTION)()
    assert config.model_spec.name == "llama3" and config.model_spec.flavor == "8B"
    check_mapped(config, plan_8b)


def test_a_70b_tp_pp_plan_builds_in_torchtitan(plan_70b: Plan, job_module) -> None:
    config = getattr(job_module(plan_70b), JOB_FUNCTION)()
    assert config.model_spec.flavor == "70B"
    check_mapped(config, plan_70b)
    stages = config.parallelism.module_fqns_per_model_part
    assert stages[0][0] == "tok_embeddings" and stages[-1][-2:] == ["norm", "lm_head"]


@pytest.mark.parametrize("checkpointing", [
    {"mode": "none"}, {"mode": "full"}, {"mode": "op_selective"}, {"mode": "selective", "every_k": 2},
])
def test_each_checkpointing_policy_and_cp(plan_8b: Plan, job_module, checkpointing: dict) -> None:
    config = dataclasses.replace(
        plan_8b.config,
        checkpointing=dataclasses.replace(plan_8b.config.checkpointing, **checkpointing),
        mesh=dataclasses.replace(plan_8b.config.mesh, cp=2, dp_shard=plan_8b.config.mesh.dp_shard // 2),
        micro_batch_size=plan_8b.config.micro_batch_size * 2,
    )
    plan = plan_8b.model_copy(update={"config": config})
    built = getattr(job_module(plan), JOB_FUNCTION)()
    check_mapped(built, plan)
    missing = mapping(plan).not_expressed
    assert any("every 2-th block" in line for line in missing) is (checkpointing.get("every_k") == 2)


def test_float8_plans_convert_the_blocks_linears(plan_8b: Plan, job_module, monkeypatch) -> None:
    # torchtitan checks for an SM89+ GPU when it builds the converter; this machine has none.
    from torchtitan.components.quantization import float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    plan = plan_8b.model_copy(update={"config": dataclasses.replace(plan_8b.config, float8="rowwise")})
    config = getattr(job_module(plan), JOB_FUNCTION)()
    check_mapped(config, plan)
    model = config.model_spec.model
    assert isinstance(model.layers[0].feed_forward.w1, float8.Float8Linear.Config)
    assert not isinstance(model.lm_head, float8.Float8Linear.Config)  # the head stays in bf16


def test_the_bundle_readme_shows_the_repriced_plan_and_what_is_not_expressed(plan_70b: Plan) -> None:
    files = {f.path: f.data for f in bundle_files(plan_70b, target="torchtitan")}
    assert set(files) == {
        "plan.json", f"{JOB_MODULE}.py", "launch.sh", "slurm.sbatch", "k8s.yaml", "k8s-pytorchjob.yaml",
        "README.md",
    }
    readme = files["README.md"].decode()
    assert "re-priced for the `torchtitan` engine" in readme and "[torchtitan]" in readme
    assert "FSDP units of" in readme  # the 70B plan wraps several blocks per unit
    launch = files["launch.sh"].decode()
    assert f"ARGS=(--module {JOB_MODULE} --config {JOB_FUNCTION})" in launch
    assert '-m torchtitan.train "${ARGS[@]}" "$@"' in launch


KUEUE = {
    "queue": "team-a",
    "node_selector": ["nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"],
    "tolerations": ["nvidia.com/gpu:NoSchedule"],
    "priority_class": "training-high",
    "image": "registry.example.com/torchtitan:0.3.0",
}


def pod_commands(doc: dict) -> list[tuple[list[str], list[str], str]]:
    """(command, args, image) of every container of a TrainJob or PyTorchJob."""
    if doc["kind"] == "TrainJob":
        trainer = doc["spec"]["trainer"]
        return [(trainer["command"], trainer["args"], trainer["image"])]
    return [
        (c["command"], c["args"], c["image"])
        for replica in doc["spec"]["pytorchReplicaSpecs"].values()
        for c in replica["template"]["spec"]["containers"]
    ]


def test_the_kubernetes_manifests_start_torchtitan_and_pass_the_schemas(
    plan_70b: Plan, 
    tmp_path: Path,
) -> None:
    write_bundle(plan_70b, tmp_path, target="torchtitan", pods=PodOptions(**KUEUE))
    directory = tmp_path / bundle_name(plan_70b)
    launch = (directory / "launch.sh").read_text()
    # launch.sh's torchtitan invocation: torchrun running torchtitan.train with the config module.
    assert f"ARGS=(--module {JOB_MODULE} --config {JOB_FUNCTION})" in launch
    assert '-m torchtitan.train "${ARGS[@]}" "$@"' in launch
    for name, job_kind in (("k8s.yaml", "TrainJob"), ("k8s-pytorchjob.yaml", "PyTorchJob")):
        checked = validate_manifest(directory / name)  # strict, at the oldest and newest Kubernetes
        assert any(c.startswith(f"{job_kind}/") for c in checked), checked
        docs = documents((directory / name).read_text())
        job = docs[job_kind]
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        # Every pod unpacks the ConfigMap's archive and runs its launch.sh: the bundle's own, byte for byte,
        # beside the config module it names.
        for command, args, image in pod_commands(job):
            assert command == ["bash", "-c", unpack_command()] and args == ["launch"]
            assert image == KUEUE["image"]
        assert unpack_command().endswith('exec ./launch.sh "$@"')
        archive = base64.b64decode(docs["ConfigMap"]["binaryData"]["bundle.tar.gz"])
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            carried = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        assert set(carried) == {"plan.json", f"{JOB_MODULE}.py", "launch.sh"}
        assert carried["launch.sh"].decode() == launch
        assert carried[f"{JOB_MODULE}.py"] == (directory / f"{JOB_MODULE}.py").read_bytes()
        text = (directory / name).read_text()
        assert "torchtitan==0.3.0: the official image has none" in text
        assert "--checkpoint.folder" in text and "--data" not in text
    readme = (directory / "README.md").read_text()
    assert "## Kubernetes" in readme and "Kueue LocalQueue `team-a`" in " ".join(readme.split())


def test_launch_sh_refuses_an_interpreter_without_torchtitan(plan_8b: Plan) -> None:
    launch = {f.path: f.data for f in bundle_files(plan_8b, target="torchtitan")}["launch.sh"].decode()
    assert 'if ! "$PYTHON" -c "import torchtitan"' in launch and "torchtitan==0.3.0" in launch


def test_the_scripts_pass_shellcheck(plan_70b: Plan, tmp_path: Path) -> None:
    write_bundle(plan_70b, tmp_path, target="torchtitan")
    for script in ("launch.sh", "slurm.sbatch"):
        lint_script(tmp_path / bundle_name(plan_70b) / script)


@pytest.mark.parametrize("model", ["qwen3-8b", "gpt2"])
def test_models_torchtitan_lacks_are_refused_with_why(model: str) -> None:
    plan = plan_for(model, "1x8xh100", sequences=64, seq_len=1024)
    with pytest.raises(NotOnTorchtitanError, match="registry has no model with"):
        bundle_files(plan, target="torchtitan")


def test_python_literal_writes_data_only() -> None:
    data = {"a": [1, 2.5, None, True, "x'\"\n"]}
    assert ast.literal_eval(python_literal(data)) == data
    for value in (float("nan"), object(), {1, 2}):
        with pytest.raises(UnsafeValueError):
            python_literal(value)


def test_the_cli_writes_the_torchtitan_bundle(plan_8b: Plan, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_8b.model_dump_json())
    out = tmp_path / "out"
    args = ["launcher", "--plan", str(plan_path), "--target", "torchtitan", "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / bundle_name(plan_8b) / f"{JOB_MODULE}.py").is_file()
    assert "--hf_assets_path" in result.output


def test_the_cli_refuses_a_model_torchtitan_lacks(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_for("gpt2", "1x8xh100", sequences=64, seq_len=1024).model_dump_json())
    result = CliRunner().invoke(app, ["launcher", "--plan", str(plan_path), "--target", "torchtitan", "-o",
                                      str(tmp_path / "out")])
    assert result.exit_code != 0 and "registry has no model" in " ".join(result.output.split())


def test_a_calibrated_plan_repriced_without_its_profile_says_so(plan_8b: Plan) -> None:
    calibrated = plan_8b.model_copy(update={"calibration_id": "7"})
    readme = {f.path: f.data for f in bundle_files(calibrated, target="torchtitan")}["README.md"].decode()
    assert "priced without the plan's calibration profile (`7`)" in " ".join(readme.split())
    plain = {f.path: f.data for f in bundle_files(plan_8b, target="torchtitan")}["README.md"].decode()
    assert "without the plan's calibration profile" not in plain


def test_mxfp8_plans_convert_the_blocks_linears(job_module, monkeypatch) -> None:
    # torchtitan checks for an SM100 GPU when it builds the converter; this machine has none.
    from torchtitan.components.quantization import mx

    monkeypatch.setattr(mx, "has_cuda_capability", lambda major, minor: True)
    b200 = plan_for("llama3-8b", "1x8xb200", sequences=64)
    plan = b200.model_copy(update={"config": dataclasses.replace(b200.config, float8="mxfp8")})
    config = getattr(job_module(plan), JOB_FUNCTION)()
    check_mapped(config, plan)
    model = config.model_spec.model
    assert isinstance(model.layers[0].attention.wo, mx.MXFP8Linear.Config)
    assert not isinstance(model.lm_head, mx.MXFP8Linear.Config)


# --- mixture-of-experts plans ------------------------------------------------------------------------



def check_experts(config: object, plan: Plan) -> None:
    """torchtitan's model has the plan's experts: their number, top-k and width in every MoE block,
    and the plan's dense blocks before them."""
    moe = plan.model.moe
    layers = config.model_spec.model.layers
    assert len(layers) == plan.model.num_layers
    routed = [i for i, layer in enumerate(layers) if getattr(layer, "moe", None) is not None]
    assert routed == [i for i in range(plan.model.num_layers) if moe.is_moe_layer(i)]
    block = layers[routed[0]].moe
    assert block.num_experts == moe.num_experts
    assert block.router.top_k == moe.experts_per_token
    assert block.routed_experts.inner_experts.hidden_dim == moe.expert_intermediate_size
    assert (block.shared_experts is not None) == (moe.num_shared_experts > 0)
    assert config.model_spec.model.dim == plan.model.hidden_size
    assert config.model_spec.model.vocab_size == plan.model.vocab_size


@pytest.mark.parametrize(("model", "cluster", "ep", "sequences", "flavor"), [
    ("qwen3-30b-a3b", "1x8xh100", 8, 256, ("qwen3", "30B-A3B")),
    ("gpt-oss-20b", "1x8xh100", 4, 256, ("gpt_oss", "20b")),
    ("deepseek-v3", "32x8xh100", 8, 4096, ("deepseek_v3", "671B")),
])
def test_moe_plans_build_in_torchtitan_with_their_ep(
    job_module, model: str, cluster: str, ep: int, sequences: int, flavor: tuple[str, str]
) -> None:
    plan = moe_plan(model, cluster, ep=ep, sequences=sequences)
    config = getattr(job_module(plan), JOB_FUNCTION)()
    assert (config.model_spec.name, config.model_spec.flavor) == flavor
    check_mapped(config, plan)  # every axis, expert_parallel_degree among them
    assert config.parallelism.expert_parallel_degree == ep
    check_experts(config, plan)


def test_an_moe_plan_with_tp_says_torchtitan_borrows_the_tp_ranks(job_module) -> None:
    plan = moe_plan("qwen3-30b-a3b", "2x8xh100", ep=4, sequences=256, tensor_parallel_degrees=[2])
    assert plan.config.mesh.tp == 2
    config = getattr(job_module(plan), JOB_FUNCTION)()
    check_mapped(config, plan)
    missing = " ".join(mapping(plan).not_expressed)
    assert "ep 4 borrows the tp ranks" in missing and "dp_shard x cp x tp / ep" in missing
    mesh = plan.config.mesh
    shards = mesh.dp_shard * mesh.cp * mesh.tp // mesh.ep
    assert mesh.expert_shards_borrowing_tp == shards and f"tp / ep = {shards} ranks" in missing


@pytest.mark.parametrize(("model", "cluster"), [
    ("llama4-scout", "8x8xh100"), ("mixtral-8x7b", "8x8xh100"), ("kimi-k2", "32x8xh100"),
])
def test_moe_models_torchtitan_lacks_are_refused_with_why(model: str, cluster: str) -> None:
    plan = moe_plan(model, cluster, ep=8, sequences=512)
    with pytest.raises(NotOnTorchtitanError, match=r"registry has no model with .* it has .*qwen3 30B-A3B"):
        bundle_files(plan, target="torchtitan")
