"""Bundles keep a plan's scale-up domains whole (issue 43, item 1): where an NVLink domain spans nodes
(GB200 NVL72 racks of 18 nodes of 4), slurm.sbatch asks for segments of a domain's nodes and a queued
TrainJob's pods are sliced a domain at a time by Kueue; 8-GPU hosts ask for nothing; all of it lints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from executor.launch.bundle import PodOptions, bundle_files, bundle_name, domain_nodes, write_bundle
from executor.launch.manifests import DOMAIN_LABEL, SLICE_SIZE, SLICE_TOPOLOGY
from planner.plan import Plan
from tests.executor.launch_lint import documents, lint_script, validate_manifest
from tests.executor.plan_factory import debug_plan


def plan_on(gpu: str, nodes: int, gpus_per_node: int, domain: int | None = None) -> Plan:
    doc = debug_plan(nodes=nodes, gpus_per_node=gpus_per_node, sharding="hybrid_shard")
    doc["cluster"]["gpu"] = gpu
    if domain is not None:
        doc["cluster"]["scaleup_domain_gpus"] = domain
    return Plan.model_validate(doc)


def sbatch_options(plan: Plan) -> list[str]:
    (sbatch,) = [f.data.decode() for f in bundle_files(plan, target="slurm") if f.path == "slurm.sbatch"]
    return [line for line in sbatch.splitlines() if line.startswith("#SBATCH")]


def trainjob_annotations(plan: Plan, **options: Any) -> dict[str, str]:
    files = {f.path: f.data.decode() for f in bundle_files(plan, target="k8s", pods=PodOptions(**options))}
    job = documents(files["k8s.yaml"])["TrainJob"]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return node["template"]["spec"]["template"].get("metadata", {}).get("annotations", {})


@pytest.mark.parametrize(
    ("gpu", "nodes", "per_node", "domain", "expected"),
    [
        ("GB200", 36, 4, None, 18),  # two NVL72 racks
        ("GB200", 32, 4, 64, 16),  # racks of which a job takes 16 trays
        ("GB200", 4, 4, None, 4),  # a job inside one rack: all of its nodes together
        ("GB200", 20, 4, None, 1),  # 20 nodes are no whole number of 18-node racks: nothing asked
        ("H100", 4, 8, None, 1),  # 8-GPU hosts: the domain is the node
    ],
)
def test_a_domain_is_asked_for_where_it_spans_nodes(
    gpu: str, nodes: int, per_node: int, domain: int | None, expected: int
) -> None:
    plan = plan_on(gpu, nodes, per_node, domain)
    assert domain_nodes(plan) == expected
    segment = [o for o in sbatch_options(plan) if o.startswith("#SBATCH --segment")]
    assert segment == ([f"#SBATCH --segment={expected}"] if expected > 1 else [])


def test_a_queued_trainjob_is_sliced_by_domain_and_lints(tmp_path: Path) -> None:
    plan = plan_on("GB200", 36, 4)
    assert trainjob_annotations(plan, queue="team-a") == {SLICE_TOPOLOGY: DOMAIN_LABEL, SLICE_SIZE: "18"}
    assert trainjob_annotations(plan) == {}  # without Kueue no scheduler reads them
    assert trainjob_annotations(plan_on("H100", 4, 8), queue="team-a") == {}
    write_bundle(plan, tmp_path, target="all", pods=PodOptions(queue="team-a"))
    root = tmp_path / bundle_name(plan)
    lint_script(root / "slurm.sbatch")
    for manifest in ("k8s.yaml", "k8s-pytorchjob.yaml"):
        validate_manifest(root / manifest)
    readme = (root / "README.md").read_text()
    assert "## Scale-up domains" in readme and "--segment=18" in readme
