"""Launch bundles for AMD Instinct GPUs (issue 43, item 3): a plan's GPU vendor chooses the GPU resource
(amd.com/gpu), the image (AMD's ROCm PyTorch image) and the ROCm environment; the scripts and
manifests lint (shellcheck, the Kubernetes schemas); NVIDIA plans are unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from executor.launch import environment, vendors
from executor.launch.bundle import DEFAULT_IMAGE, PodOptions, Target, bundle_files, bundle_name, write_bundle
from executor.launch.calibration import calibration_bundle_files
from executor.launch.quoting import UnsafeValueError
from executor.launch.skypilot import NotOnSkyPilotError
from planner.catalog.gpus import resolve_gpu
from planner.gpu_spec import GpuSpec
from planner.plan import Plan
from planner.specs import ClusterSpec
from tests.executor.launch_lint import documents, lint_script, validate_manifest
from tests.executor.plan_factory import debug_plan

ROCM_IMAGE = "rocm/pytorch:rocm7.2_ubuntu24.04_py3.12_pytorch_release_2.13.0"
ROCM_ONLY = {v.name for v in environment.ROCM_ENV}


def plan_on(gpu: str, nodes: int = 2) -> Plan:
    doc = debug_plan(nodes=nodes, gpus_per_node=8, sharding="hybrid_shard" if nodes > 1 else "full_shard")
    doc["cluster"]["gpu"] = gpu
    return Plan.model_validate(doc)


def texts(plan: Plan, target: Target = "all", **options: Any) -> dict[str, str]:
    return {f.path: f.data.decode() for f in bundle_files(plan, target=target, pods=PodOptions(**options))}


def pod_containers(files: dict[str, str]) -> list[dict[str, Any]]:
    """The trainer's container in both manifests (the TrainJob's trainer, the PyTorchJob's Master)."""
    trainer = documents(files["k8s.yaml"])["TrainJob"]["spec"]["trainer"]
    master = documents(files["k8s-pytorchjob.yaml"])["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]
    container = master["template"]["spec"]["containers"][0]
    return [
        {"image": trainer["image"], "limits": trainer["resourcesPerNode"]["limits"], "env": trainer["env"]},
        {"image": container["image"], "limits": container["resources"]["limits"], "env": container["env"]},
    ]


@pytest.mark.parametrize("gpu", ["MI300X", "MI325X", "MI355X"])
def test_an_amd_plan_asks_for_amd_gpus_in_the_rocm_image_and_lints(gpu: str, tmp_path: Path) -> None:
    plan = plan_on(gpu)
    files = texts(plan, target="all")
    for container in pod_containers(files):
        assert container["limits"] == {"amd.com/gpu": 8}
        assert container["image"] == ROCM_IMAGE
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["HSA_NO_SCRATCH_RECLAIM"] == "1"
        assert env["PYTORCH_HIP_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"]  # the priced allocator
    for script in ("launch.sh", "slurm.sbatch"):
        assert all(f"env_default {name} " in files[script] for name in ROCM_ONLY), script
    assert "## AMD GPUs (ROCm)" in files["README.md"]
    assert "`amd.com/gpu`" in files["README.md"] and "--rocm-version A.B" in files["README.md"]
    # SkyPilot's setup installs CUDA wheels: the bundle for every target says why it has no task.
    assert "skypilot.yaml" not in files and "ROCm build of torch" in files["README.md"]
    write_bundle(plan, tmp_path, target="all")
    root = tmp_path / bundle_name(plan)
    for script in ("launch.sh", "slurm.sbatch"):
        lint_script(root / script)
    for manifest in ("k8s.yaml", "k8s-pytorchjob.yaml"):
        validate_manifest(root / manifest)


def test_an_nvidia_plan_is_launched_as_before() -> None:
    files = texts(plan_on("H100-SXM-80GB"), target="all")
    for container in pod_containers(files):
        assert container["limits"] == {"nvidia.com/gpu": 8} and container["image"] == DEFAULT_IMAGE
        assert not ROCM_ONLY & {e["name"] for e in container["env"]}
    assert not any(name in files["launch.sh"] for name in ROCM_ONLY)
    assert "## AMD GPUs" not in files["README.md"] and "skypilot.yaml" in files


def test_the_rocm_version_names_amds_image_and_a_bad_one_is_refused() -> None:
    plan = plan_on("MI300X", nodes=1)
    files = texts(plan, target="k8s", rocm_version="6.4.1", torch_version="2.9.0")
    (first, _) = pod_containers(files)
    assert first["image"] == "rocm/pytorch:rocm6.4.1_ubuntu24.04_py3.12_pytorch_release_2.9.0"
    assert pod_containers(texts(plan, target="k8s", image="registry.example.com/rocm:1"))[0]["image"] == (
        "registry.example.com/rocm:1"
    )
    with pytest.raises(UnsafeValueError) as caught:
        bundle_files(plan, target="k8s", pods=PodOptions(rocm_version="7"))
    assert caught.value.field == "rocm_version"


def test_another_vendors_gpus_need_their_own_image() -> None:
    # An AMD plan's pods asked for NVIDIA GPUs would get a ROCm image: refused, naming the image.
    with pytest.raises(UnsafeValueError, match="CUDA build of torch") as caught:
        bundle_files(plan_on("MI355X"), target="k8s", pods=PodOptions(gpu_resource="nvidia.com/gpu"))
    assert caught.value.field == "image"
    files = texts(plan_on("MI355X"), target="k8s", gpu_resource="nvidia.com/gpu", image="my/cuda:1")
    assert pod_containers(files)[0]["limits"] == {"nvidia.com/gpu": 8}
    with pytest.raises(UnsafeValueError, match="ROCm build of torch"):
        bundle_files(plan_on("H100-SXM-80GB"), target="k8s", pods=PodOptions(gpu_resource="amd.com/gpu"))
    with pytest.raises(NotOnSkyPilotError, match="ROCm"):
        bundle_files(plan_on("MI300X"), target="skypilot")


def test_the_vendor_is_the_die_and_a_custom_cdna_gpu_is_amds() -> None:
    assert {vendors.vendor_of(resolve_gpu(name)) for name in ("MI300X", "MI325X", "MI355X")} == {"amd"}
    nvidia = ("H100", "H200", "B200", "GB200", "GB300", "B300", "L40S", "H20", "H800", "A100", "cpu")
    assert {vendors.vendor_of(resolve_gpu(name)) for name in nvidia} == {"nvidia"}
    mi300x = resolve_gpu("MI300X").model_dump()
    custom = GpuSpec.model_validate({**mi300x, "name": "my-mi300a", "aliases": ()})
    assert vendors.stack_for(custom) is vendors.AMD
    assert vendors.stack_for(custom.model_copy(update={"chip": None})) is vendors.NVIDIA


def test_an_amd_calibration_bundle_sets_the_rocm_environment(tmp_path: Path) -> None:
    files = {f.path: f.data.decode() for f in calibration_bundle_files(ClusterSpec.parse("2x8xMI300X"))}
    for script in ("calibrate.sh", "calibrate.sbatch"):
        assert all(f"env_default {name} " in files[script] for name in ROCM_ONLY), script
        path = tmp_path / script
        path.write_text(files[script])
        lint_script(path)
