"""The linters every generated launcher must pass (the CI lint of issue 14):

- scripts: `bash -n`, then `shellcheck` at every severity (Debian's package; scripts/test.sh installs
  it). Without shellcheck on the machine the lint skips, saying so loudly, rather than pass unseen.
- manifests: every document validates against the Kubernetes schema with `kubernetes-validate`
  (bundled schemas, strict: unknown fields are errors), at the oldest and the newest Kubernetes it
  ships. Kubeflow's TrainJob and PyTorchJob are custom resources whose schemas it does not ship: what
  they put in their pods (containers, volumes, resources, env, security context) is validated as a
  core PodTemplate instead, and the custom fields around it are checked by the tests that read them.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

KUBERNETES_VERSIONS = ("1.29", "1.37")
"""The oldest Kubernetes still widely run and kubernetes-validate's newest schema."""
CUSTOM_KINDS = {"TrainJob", "PyTorchJob"}


def shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        pytest.skip(
            "SHELLCHECK IS NOT INSTALLED: the generated scripts were NOT linted. "
            "Install Debian's package (apt-get install shellcheck; scripts/test.sh does it)."
        )
    return found


def lint_script(path: Path) -> None:
    """bash -n and shellcheck (all severities, bash dialect) pass on `path`."""
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, f"bash -n {path.name}:\n{syntax.stderr}"
    lint = subprocess.run(
        [shellcheck(), "--shell=bash", "--severity=style", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, f"shellcheck {path.name}:\n{lint.stdout}{lint.stderr}"


def documents(text: str) -> dict[str, dict[str, Any]]:
    """A manifest's documents by kind (each kind once)."""
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), [d["kind"] for d in docs]
    return by_kind


def _pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """What a custom resource puts in its pods, as core v1 PodTemplates."""
    name = doc["metadata"]["name"]
    if doc["kind"] == "PyTorchJob":
        return [
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{role.lower()}"},
             "template": replica["template"]}
            for role, replica in doc["spec"]["pytorchReplicaSpecs"].items()
        ]
    # TrainJob: the trainer's container (image, command, resources, env) merged with the pod patch
    # (volumes, grace period) and the container patch (mounts, security context) the runtime applies.
    trainer = doc["spec"]["trainer"]
    (patch,) = doc["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node", "the torch-distributed runtime's replicated job is `node`"
    pod = copy.deepcopy(job["template"]["spec"]["template"]["spec"])
    (container,) = pod.pop("containers")
    assert container["name"] == "node", "the torch-distributed runtime's container is `node`"
    container.update(
        image=trainer["image"],
        command=trainer["command"],
        args=trainer["args"],
        env=trainer["env"],
        resources=trainer["resourcesPerNode"],
    )
    pod["containers"] = [container]
    return [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
             "template": {"spec": pod}}]


def validate_manifest(path: Path) -> list[str]:
    """Validate every document of `path`; returns what was validated (`Kind/name@version`)."""
    import kubernetes_validate  # the dev extra has it: a missing validator is a failure, not a skip

    checked = []
    for kind, doc in documents(path.read_text()).items():
        targets = _pod_templates(doc) if kind in CUSTOM_KINDS else [doc]
        for target in targets:
            for version in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(target, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    where = ".".join(str(p) for p in exc.path)
                    raise AssertionError(
                        f"{path.name}: {kind} ({target['kind']}) fails Kubernetes {version} at {where}: "
                        f"{exc.message}"
                    ) from None
                checked.append(f"{kind}/{target['metadata']['name']}@{version}")
    return checked
