"""The SkyPilot target (issue 41, item 2): skypilot.yaml validates against SkyPilot's own task and
resources schemas (copied from skypilot 0.14.1 by scripts/skypilot_task_schema.py: the package's pins
exclude the service's, so it cannot join the test environment), asks for the plan's nodes and
accelerators, and its run script starts launch.sh with the rendezvous from SkyPilot's environment."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from executor.launch.bundle import PodOptions, Target, bundle_files, bundle_name, write_bundle
from executor.launch.skypilot import ACCELERATORS, UNAVAILABLE, NotOnSkyPilotError
from executor.launch.vendors import vendor_of
from planner.catalog.gpus import GPU_CATALOG
from planner.plan import Plan
from tests.executor.launch_lint import lint_script
from tests.executor.plan_factory import debug_plan

SCHEMAS = json.loads((Path(__file__).parent / "schemas" / "skypilot_task_schema.json").read_text())


def _enum(*, case_sensitive: bool) -> Any:
    def check(validator: Any, enums: list[str], instance: str, schema: Any) -> Any:
        fold = (lambda text: text) if case_sensitive else str.lower
        if fold(instance) not in [fold(e) for e in enums]:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    return check


# SkyPilot's validator (sky/utils/validator.py): Draft 7 with its two enum keywords.
Validator = jsonschema.validators.extend(
    jsonschema.Draft7Validator,
    validators={"case_insensitive_enum": _enum(case_sensitive=False),
                "case_sensitive_enum": _enum(case_sensitive=True)},
)


def validate_task(task: dict[str, Any]) -> None:
    """What sky.Task.from_yaml checks: the task, then its resources, with SkyPilot's validator."""
    Validator(SCHEMAS["task"]).validate(task)
    Validator(SCHEMAS["resources"]).validate(task["resources"])


def gpu_plan(nodes: int = 2, gpu: str = "H100-SXM-80GB", **kwargs: Any) -> Plan:
    doc = debug_plan(nodes=nodes, gpus_per_node=8, sharding="hybrid_shard" if nodes > 1 else "full_shard",
                     **kwargs)
    doc["cluster"]["gpu"] = gpu
    return Plan.model_validate(doc)


def files(plan: Plan, target: Target = "all", **options: Any) -> dict[str, str]:
    return {f.path: f.data.decode() for f in bundle_files(plan, target=target, pods=PodOptions(**options))}


def test_the_schema_is_skypilots() -> None:
    assert SCHEMAS["skypilot_version"] == "0.14.1"
    assert SCHEMAS["task"]["additionalProperties"] is False  # unknown fields are errors


@pytest.mark.parametrize("gpu", sorted(ACCELERATORS))
def test_the_task_validates_and_asks_for_the_plans_nodes_and_gpus(gpu: str) -> None:
    text = files(gpu_plan(gpu=gpu), target="skypilot")["skypilot.yaml"]
    task = yaml.safe_load(text)
    validate_task(task)
    assert task["num_nodes"] == 2
    assert task["resources"] == {"accelerators": f"{ACCELERATORS[gpu]}:8"}
    assert task["workdir"] == "."
    assert set(task["envs"]) == {"DATA", "SYNTHETIC_DATA", "CHECKPOINT_DIR", "TRAIN_ARGS"}
    assert "python3 -m pip install -r requirements.txt" in task["setup"]
    assert "setup: |" in text and "run: |" in text  # the scripts read as scripts


def test_every_catalog_gpu_maps_to_a_skypilot_accelerator_or_says_why_not() -> None:
    gpus = {name for name, spec in GPU_CATALOG.items() if not spec.is_cpu}
    amd = {name for name, spec in GPU_CATALOG.items() if vendor_of(spec) == "amd"}  # ROCm: its own reason
    assert gpus == set(ACCELERATORS) | set(UNAVAILABLE) | amd and not amd & set(ACCELERATORS)
    assert ACCELERATORS["H100-SXM-80GB"] == "H100" and ACCELERATORS["A100-40GB"] == "A100"


def test_cpu_plans_ask_for_cores_and_an_image_runs_in_docker() -> None:
    task = yaml.safe_load(files(Plan.model_validate(debug_plan()), target="skypilot")["skypilot.yaml"])
    validate_task(task)
    assert task["num_nodes"] == 1 and task["resources"] == {"cpus": "2+"}
    assert "NPROC_PER_NODE" not in task["run"]  # the plan's process count, not SkyPilot's 0 GPUs
    task = yaml.safe_load(files(gpu_plan(), target="skypilot", image="registry.example.com/t/train:1")[
        "skypilot.yaml"])
    validate_task(task)
    assert task["resources"]["image_id"] == "docker:registry.example.com/t/train:1"


def test_requirements_are_the_plans_torch_and_torchao_for_float8() -> None:
    plain = files(gpu_plan(), target="skypilot", torch_version="2.10.0", cuda_version="12.8")
    assert plain["requirements.txt"] == "torch==2.10.0\n"
    float8 = files(gpu_plan(float8="tensorwise"), target="skypilot")
    assert float8["requirements.txt"].splitlines()[1].startswith("torchao==")
    validate_task(yaml.safe_load(float8["skypilot.yaml"]))


def test_the_validator_catches_a_broken_task() -> None:
    task = yaml.safe_load(files(gpu_plan(), target="skypilot")["skypilot.yaml"])
    for field, value in (("num_nodes", "two"), ("nodes", 2), ("envs", {"BAD KEY": "x"})):
        broken = {**copy.deepcopy(task), field: value}
        with pytest.raises(jsonschema.ValidationError):
            validate_task(broken)
    with pytest.raises(jsonschema.ValidationError):
        validate_task({**task, "resources": {"accelerator": "H100:8"}})  # misspelt


def test_a_gpu_no_cloud_offers_is_refused_with_why_and_left_out_of_all() -> None:
    plan = gpu_plan(gpu="H100-SXM-96GB")
    with pytest.raises(NotOnSkyPilotError, match="plan for H100-SXM-80GB") as caught:
        bundle_files(plan, target="skypilot")
    assert caught.value.field == "target"
    every = files(plan, target="all")
    assert "skypilot.yaml" not in every and "k8s.yaml" in every
    assert "No `skypilot.yaml`: the 96 GB H100" in every["README.md"]


def test_the_scripts_pass_shellcheck_and_run_starts_launch_sh_at_skypilots_head(tmp_path: Path) -> None:
    plan = gpu_plan()
    write_bundle(plan, tmp_path, target="skypilot")
    bundle = tmp_path / bundle_name(plan)
    task = yaml.safe_load((bundle / "skypilot.yaml").read_text())
    for part in ("setup", "run"):
        script = tmp_path / f"{part}.sh"
        script.write_text("#!/usr/bin/env bash\n" + task[part])
        lint_script(script)
    # SkyPilot runs `run` with bash in the workdir; an interpreter stand-in records what torchrun gets.
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\necho "$@" > {tmp_path}/args\n')
    fake.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"], "PYTHON": str(fake), "FSDP_ENV_SHOWN": "1",
        "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "8", **task["envs"],
        "SYNTHETIC_DATA": "1", "TRAIN_ARGS": "--steps 20 --log-every 5",
    }
    run = subprocess.run(["bash", "-c", task["run"]], cwd=bundle, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert "node 1 of 2: rendezvous on 10.0.0.7" in run.stdout
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["-m", "torch.distributed.run"]
    assert args[args.index("--rdzv-endpoint") + 1] == "10.0.0.7:29500"
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--nproc-per-node") + 1] == "8"
    assert args[-5:] == ["--synthetic-data", "--steps", "20", "--log-every", "5"]
    # With the task's defaults (no data named), launch.sh refuses before torchrun starts.
    refused = subprocess.run(["bash", "-c", task["run"]], cwd=bundle, env={**env, **task["envs"]},
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "no training data" in refused.stderr
