"""Where the Kubernetes manifests' pods are scheduled (issue 41, item 3): a Kueue queue (its label and
`suspend`), node selectors, tolerations, a priority class and the GPU resource name, each validated
against the Kubernetes schemas and refused with the option's name when bad."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from executor.launch.bundle import PodOptions, bundle_files, bundle_name, write_bundle
from executor.launch.quoting import (
    DNS_SUBDOMAIN_PATTERN,
    NODE_SELECTOR_PATTERN,
    QUEUE_PATTERN,
    TOLERATION_PATTERN,
    UnsafeValueError,
)
from executor.launch.scheduling import QUEUE_LABEL, scheduling, toleration
from planner.plan import Plan
from tests.executor.launch_lint import documents, validate_manifest
from tests.executor.plan_factory import debug_plan

OPTIONS: dict[str, Any] = {
    "queue": "team-a",
    "node_selector": ["nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3", "pool=training"],
    "tolerations": ["nvidia.com/gpu:NoSchedule", "dedicated=training:NoExecute", "spot"],
    "priority_class": "training-high",
}
POD_FIELDS = {
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "training"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute"},
        {"key": "spot", "operator": "Exists"},
    ],
    "priorityClassName": "training-high",
}


def gpu_plan(nodes: int = 2) -> Plan:
    doc = debug_plan(nodes=nodes, gpus_per_node=8, sharding="hybrid_shard" if nodes > 1 else "full_shard")
    doc["cluster"]["gpu"] = "H100-SXM-80GB"
    return Plan.model_validate(doc)


def manifests(plan: Plan, **options: Any) -> dict[str, dict[str, dict[str, Any]]]:
    files = {f.path: f.data.decode() for f in bundle_files(plan, target="k8s", pods=PodOptions(**options))}
    return {name: documents(files[name]) for name in ("k8s.yaml", "k8s-pytorchjob.yaml")}


def trainjob_pod(job: dict[str, Any]) -> dict[str, Any]:
    (patch,) = job["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return replicated["template"]["spec"]["template"]["spec"]


def test_every_option_lands_in_both_jobs_and_passes_the_schemas(tmp_path: Path) -> None:
    plan = gpu_plan()
    write_bundle(plan, tmp_path, target="k8s", pods=PodOptions(**OPTIONS))
    for name in ("k8s.yaml", "k8s-pytorchjob.yaml"):
        # kubernetes-validate, strict, at the oldest and newest Kubernetes (the pods as PodTemplates).
        checked = validate_manifest(tmp_path / bundle_name(plan) / name)
        assert any(c.startswith(("TrainJob/", "PyTorchJob/")) for c in checked), checked
    docs = manifests(plan, **OPTIONS)
    trainjob = docs["k8s.yaml"]["TrainJob"]
    assert trainjob["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert trainjob["spec"]["suspend"] is True  # Kueue unsuspends it on admission
    pod = trainjob_pod(trainjob)
    assert {key: pod[key] for key in POD_FIELDS} == POD_FIELDS
    pytorchjob = docs["k8s-pytorchjob.yaml"]["PyTorchJob"]
    assert pytorchjob["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert pytorchjob["spec"]["runPolicy"]["suspend"] is True
    for role in ("Master", "Worker"):
        pod = pytorchjob["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
        assert {key: pod[key] for key in POD_FIELDS} == POD_FIELDS
    # The queue is the job's alone: the claim and the ConfigMap are not workloads.
    for kind in ("PersistentVolumeClaim", "ConfigMap"):
        assert QUEUE_LABEL not in docs["k8s.yaml"][kind]["metadata"]["labels"]
    files = bundle_files(plan, target="k8s", pods=PodOptions(**OPTIONS))
    text = next(f.data.decode() for f in files if f.path == "k8s.yaml")
    assert "# Kueue: the job waits in LocalQueue team-a" in text
    assert "trainer.kubeflow.org/trainjob" in text


def test_the_defaults_add_nothing() -> None:
    docs = manifests(gpu_plan())
    trainjob = docs["k8s.yaml"]["TrainJob"]
    assert set(trainjob["metadata"]["labels"]) == {"fsdp-planner/plan"}
    assert "suspend" not in trainjob["spec"]
    assert not set(POD_FIELDS) & set(trainjob_pod(trainjob))
    assert "suspend" not in docs["k8s-pytorchjob.yaml"]["PyTorchJob"]["spec"]["runPolicy"]
    assert trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 8}


def test_amd_gpus_are_requested_as_amd_gpus_from_a_rocm_image(tmp_path: Path) -> None:
    plan = gpu_plan()
    rocm = {"gpu_resource": "amd.com/gpu", "image": "rocm/pytorch:latest-release"}
    docs = manifests(plan, **rocm)
    assert docs["k8s.yaml"]["TrainJob"]["spec"]["trainer"]["resourcesPerNode"]["limits"] == {"amd.com/gpu": 8}
    master = docs["k8s-pytorchjob.yaml"]["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]
    assert master["template"]["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": 8}
    write_bundle(plan, tmp_path, target="k8s", pods=PodOptions(**rocm))
    validate_manifest(tmp_path / bundle_name(plan) / "k8s.yaml")
    # PyTorch's official image is a CUDA build: AMD without an image is refused, naming the image.
    with pytest.raises(UnsafeValueError, match="ROCm") as caught:
        bundle_files(plan, target="k8s", pods=PodOptions(gpu_resource="amd.com/gpu"))
    assert caught.value.field == "image"
    # A CPU plan requests cores whatever the GPU resource.
    cpu = manifests(Plan.model_validate(debug_plan()), **rocm)
    assert "amd.com/gpu" not in str(cpu["k8s.yaml"]["TrainJob"]["spec"]["trainer"]["resourcesPerNode"])


@pytest.mark.parametrize(
    ("option", "value", "field", "message"),
    [
        ("queue", "Team A", "queue", "Kueue LocalQueue"),
        ("queue", "q" * 64, "queue", "at most 63"),
        ("queue", "team-a; rm -rf /", "queue", "LocalQueue"),
        ("node_selector", ["pool"], "node_selector", "key=value"),
        ("node_selector", ["pool=a b"], "node_selector", "label value"),
        ("node_selector", ["-bad=x"], "node_selector", "label key"),
        ("node_selector", ["Bad_Domain/x=y"], "node_selector", "label key"),
        ("node_selector", ["pool=a", "pool=b"], "node_selector", "given twice"),
        ("tolerations", ["gpu:NoRun"], "toleration", "NoSchedule, PreferNoSchedule, NoExecute"),
        ("tolerations", ["=x:NoSchedule"], "toleration", "label key"),
        ("tolerations", ["gpu=$(reboot)"], "toleration", "label value"),
        ("priority_class", "High", "priority_class", "object name"),
        ("gpu_resource", "intel.com/gpu", "gpu_resource", "nvidia.com/gpu, amd.com/gpu"),
        ("gpu_resource", "nvidia.com/mig-1g.10gb", "gpu_resource", "choose one of"),
        ("rdma_resource", "amd.com/gpu", "rdma_resource", "is the GPUs"),
    ],
)
def test_bad_values_are_refused_naming_the_option(option: str, value: Any, field: str, message: str) -> None:
    with pytest.raises(UnsafeValueError) as caught:
        bundle_files(gpu_plan(), target="k8s", pods=PodOptions(**{option: value}))
    assert caught.value.field == field
    assert message in str(caught.value)


def test_toleration_syntax_is_kubectl_taints() -> None:
    assert toleration("gpu") == {"key": "gpu", "operator": "Exists"}
    assert toleration("gpu=a100") == {"key": "gpu", "operator": "Equal", "value": "a100"}
    assert toleration("example.com/gpu:NoExecute") == {
        "key": "example.com/gpu", "operator": "Exists", "effect": "NoExecute"
    }


@example("tolerations", "/d")  # an empty prefix: refused by both
@example("node_selector", "b.c/d=v")
@example("tolerations", "a=:NoSchedule")
@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.sampled_from(["queue", "node_selector", "tolerations", "priority_class"]),
       st.text(alphabet=st.sampled_from("aZ09-_./=:é NoScheduleExecutePrefer"), max_size=40))
def test_the_api_schema_patterns_agree_with_the_validators(option: str, text: str) -> None:
    # The API declares these patterns; the validators decide. Where they disagree, a schema-valid
    # request is refused (or a refused one documented as valid): they must accept the same strings.
    pattern = {"queue": QUEUE_PATTERN, "node_selector": NODE_SELECTOR_PATTERN,
               "tolerations": TOLERATION_PATTERN, "priority_class": DNS_SUBDOMAIN_PATTERN}[option]
    value: Any = [text] if option in ("node_selector", "tolerations") else text
    try:
        scheduling(**{option: value})
        accepted = True
    except UnsafeValueError:
        accepted = False
    assert accepted == (re.fullmatch(pattern, text) is not None), (option, text)
