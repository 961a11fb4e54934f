"""Cluster plumbing of the launch bundles (issue 14, part 5): the environment the scripts set and how
a user overrides it, SLURM's preemption signal and requeue, the Kubernetes volumes / image / RDMA /
ConfigMap, and the linters every generated file passes (bash -n, shellcheck, the Kubernetes schema)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.launch import bundle as bundle_module
from executor.launch.bundle import (
    DEFAULT_IMAGE,
    BundleTooLargeError,
    PodOptions,
    bundle_files,
    bundle_name,
    official_image,
    write_bundle,
)
from executor.launch.calibration import write_calibration_bundle
from executor.launch.quoting import UnsafeValueError
from executor.runtime.distributed import LaunchError, pg_timeout_s
from planner.catalog.models import catalog_model, resolve_model
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.executor.conftest import explain
from tests.executor.launch_lint import documents, lint_script, validate_manifest
from tests.executor.plan_factory import debug_plan

SCRIPTS = ("launch.sh", "slurm.sbatch")
MANIFESTS = ("k8s.yaml", "k8s-pytorchjob.yaml")


def gpu_plan(nodes: int, gpus: int = 8) -> Plan:
    doc = debug_plan(nodes=nodes, gpus_per_node=gpus, sharding="hybrid_shard" if nodes > 1 else "full_shard")
    doc["cluster"]["gpu"] = "H100-SXM-80GB"
    return Plan.model_validate(doc)


def planned_tp2() -> Plan:
    """A real tensor-parallel plan from the planner (2 nodes x 4 CPU ranks, tp 2)."""
    return make_plan(
        PlanRequest(
            model=resolve_model("llama-debug"),
            cluster=ClusterSpec.parse("2x4xcpu"),
            training=TrainingSpec(seq_len=128, global_batch_tokens=128 * 32),
            search=SearchSpace(tensor_parallel_degrees=[2], shardings=["full_shard"]),
        )
    )


PLANS = {
    "1-node-cpu": lambda: Plan.model_validate(debug_plan()),
    "1-node-gpu": lambda: gpu_plan(1),
    "4-node-gpu": lambda: gpu_plan(4),
    "2-node-tp2": planned_tp2,
}


# ---------------------------------------------------------------------------------------- linters


@pytest.mark.parametrize("which", sorted(PLANS))
def test_every_generated_file_passes_the_linters(tmp_path: Path, which: str) -> None:
    plan = PLANS[which]()
    variants = {"plain": {}, "rdma": {"rdma_resource": "rdma/rdma_shared_device_a", "rdma_count": 2}}
    for variant, options in variants.items():
        write_bundle(plan, tmp_path / variant, target="all", pods=PodOptions(**options))
        directory = tmp_path / variant / bundle_name(plan)
        for script in SCRIPTS:
            lint_script(directory / script)
        for manifest in MANIFESTS:
            checked = validate_manifest(directory / manifest)
            job = "TrainJob" if manifest == "k8s.yaml" else "PyTorchJob"
            # The job's pods were validated too (as core PodTemplates), at both Kubernetes versions.
            assert {c.split("/")[0] for c in checked} == {"ConfigMap", "PersistentVolumeClaim", job}, checked
    # The calibration bundle's scripts share the templates: they pass too.
    calibration = write_calibration_bundle(plan.cluster, tmp_path / "calibration")
    for script in ("calibrate.sh", "calibrate.sbatch"):
        lint_script(calibration / script)


def test_the_linter_catches_a_broken_manifest(tmp_path: Path) -> None:
    # The validator is strict: a misspelt field or a value of the wrong type fails the test suite.
    plan = gpu_plan(2)
    text = next(f.data.decode() for f in bundle_files(plan) if f.path == "k8s-pytorchjob.yaml")
    for broken in (text.replace("mountPath: /dev/shm", "mountpath: /dev/shm"),
                   text.replace("terminationGracePeriodSeconds: 300", "terminationGracePeriodSeconds: 5m")):
        path = tmp_path / "broken.yaml"
        path.write_text(broken)
        with pytest.raises(AssertionError, match="fails Kubernetes"):
            validate_manifest(path)


# ------------------------------------------------------------------------------ the environment


def record_env_python(tmp_path: Path) -> Path:
    """An interpreter that passes launch.sh's torch probe and records the environment torchrun gets."""
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\nenv > {tmp_path}/env\n')
    fake.chmod(0o755)
    return fake


def recorded_env(tmp_path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    return dict(pairs)


def test_launch_sh_sets_the_cluster_environment_and_yours_wins(tmp_path: Path) -> None:
    plan = Plan.model_validate(debug_plan())
    write_bundle(plan, tmp_path, target="torchrun")
    launch = tmp_path / bundle_name(plan) / "launch.sh"
    base = {"PATH": os.environ["PATH"], "PYTHON": str(record_env_python(tmp_path)), "SYNTHETIC_DATA": "1"}

    run = subprocess.run([str(launch)], env=base, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    env = recorded_env(tmp_path)
    assert {k: env.get(k) for k in (
        "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG", "FSDP_PG_TIMEOUT_S",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    )} == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN", "FSDP_PG_TIMEOUT_S": "1800", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "240",
    }
    assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))  # cores / 2 ranks
    for unset in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "TORCH_NCCL_BLOCKING_WAIT", "GLOO_SOCKET_IFNAME"):
        assert unset not in env, f"{unset} has an empty default: it must stay unset"
    # Printed once at the start: what is set, and what is left unset.
    assert "launch.sh: cluster environment" in run.stdout
    assert "  NCCL_DEBUG=WARN\n" in run.stdout
    assert re.search(r"  unset: .*NCCL_SOCKET_IFNAME.*NCCL_IB_HCA", run.stdout)

    yours = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": "3",
             "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512", "FSDP_PG_TIMEOUT_S": "600"}
    run = subprocess.run([str(launch)], env={**base, **yours}, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr
    env = recorded_env(tmp_path)
    assert {k: env[k] for k in yours} == yours
    assert "  NCCL_SOCKET_IFNAME=ib0  (given)\n" in run.stdout

    # Shown once per job: slurm.sbatch prints it and sets FSDP_ENV_SHOWN for every node's launch.sh.
    quiet = subprocess.run([str(launch)], env={**base, "FSDP_ENV_SHOWN": "1"}, capture_output=True,
                           text=True, timeout=60, check=False)
    assert quiet.returncode == 0 and "cluster environment" not in quiet.stdout

    for bad in ("abc", "0", "1; reboot"):
        refused = subprocess.run([str(launch)], env={**base, "FSDP_PG_TIMEOUT_S": bad}, capture_output=True,
                                 text=True, timeout=60, check=False)
        assert refused.returncode == 2
        assert "FSDP_PG_TIMEOUT_S must be a positive whole number" in refused.stderr
    # The header documents every variable.
    header = launch.read_text().split("set -euo pipefail")[0]
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT",
                 "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "FSDP_PG_TIMEOUT_S", "OMP_NUM_THREADS"):
        assert f"#   {name} " in header, name


@pytest.mark.parametrize("script", ["launch.sh", "calibrate.sh"])
def test_a_multi_node_start_without_master_addr_is_refused(tmp_path: Path, script: str) -> None:
    # Defaulting to 127.0.0.1 made every node host its own rendezvous and wait for the others forever.
    plan = gpu_plan(2)
    if script == "launch.sh":
        write_bundle(plan, tmp_path, target="torchrun")
        directory = tmp_path / bundle_name(plan)
    else:
        directory = write_calibration_bundle(plan.cluster, tmp_path / "calibration")
    lint_script(directory / script)
    base = {"PATH": os.environ["PATH"], "PYTHON": str(record_env_python(tmp_path)), "SYNTHETIC_DATA": "1"}

    for env in ({}, {"NNODES": "2"}):  # the plan's 2 nodes, or NNODES given
        refused = subprocess.run([str(directory / script)], env={**base, **env}, capture_output=True,
                                 text=True, timeout=60, check=False)
        assert refused.returncode == 2, refused.stderr
        assert f"{script}: NNODES=2 needs MASTER_ADDR, the address of node 0" in refused.stderr
        assert not (tmp_path / "env").exists(), "torchrun must not start"
    for given in ({"MASTER_ADDR": "10.0.0.1"}, {"PET_MASTER_ADDR": "10.0.0.1"}, {"NNODES": "1"}):
        started = subprocess.run([str(directory / script)], env={**base, **given}, capture_output=True,
                                 text=True, timeout=60, check=False)
        assert started.returncode == 0, (given, started.stderr)


def test_the_trainer_takes_its_process_group_timeout_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("FSDP_PG_TIMEOUT_S", raising=False)
    assert pg_timeout_s() == 1800.0
    monkeypatch.setenv("FSDP_PG_TIMEOUT_S", "600")
    assert pg_timeout_s() == 600.0
    for bad in ("soon", "0", "-5", "nan", "inf"):
        monkeypatch.setenv("FSDP_PG_TIMEOUT_S", bad)
        with pytest.raises(LaunchError, match="FSDP_PG_TIMEOUT_S"):
            pg_timeout_s()


# -------------------------------------------------------------------------------------- SLURM


def slurm_tools(tmp_path: Path) -> dict[str, str]:
    """Fake `srun` and `scontrol` on PATH. srun records its environment; FAKE_SRUN=wait makes it run
    until it gets SIGUSR1 (then exit 0, as the trainer does after its checkpoint), else it exits with
    FAKE_SRUN's number. `scontrol requeue` records the job id and exits with FAKE_REQUEUE_RC."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tools = {
        "scontrol": f"""
if [ "$1" = show ]; then echo node-a; echo node-b; exit 0; fi
echo "$@" >> {tmp_path}/scontrol
exit "${{FAKE_REQUEUE_RC:-0}}"
""",
        "srun": f"""
env > {tmp_path}/srun-env
if [ "${{FAKE_SRUN:-0}}" = wait ]; then
  trap 'echo usr1 > {tmp_path}/srun-got; exit 0' USR1
  echo $$ > {tmp_path}/srun-pid
  for _ in $(seq 300); do sleep 0.1; done
  exit 9
fi
exit "${{FAKE_SRUN:-0}}"
""",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "8"}


def sbatch_bundle(tmp_path: Path) -> Path:
    plan = gpu_plan(2, gpus=2)
    write_bundle(plan, tmp_path, target="slurm")
    return tmp_path / bundle_name(plan)


def run_sbatch(directory: Path, env: dict[str, str], *, preempt: bool) -> subprocess.CompletedProcess[str]:
    """Run slurm.sbatch as SLURM would; with `preempt`, send the batch shell SIGUSR1 once srun runs
    (`--signal=B:USR1`: the batch shell only)."""
    env = {**env, "BUNDLE_DIR": str(directory), **({"FAKE_SRUN": "wait"} if preempt else {})}
    proc = subprocess.Popen([str(directory / "slurm.sbatch")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if preempt:
        pid_file = directory.parent / "srun-pid"
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "srun never started"
        proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sbatch_asks_for_the_signal_and_requeue() -> None:
    text = next(f.data.decode() for f in bundle_files(gpu_plan(2)) if f.path == "slurm.sbatch")
    directives = re.findall(r"^#SBATCH (.+)$", text, re.M)
    assert {"--signal=B:USR1@300", "--requeue", "--open-mode=append"} <= set(directives)
    assert "Exit status: 0 trained to the end" in text and "75 stopped by SIGUSR1" in text


def test_sbatch_passes_the_trainers_status_and_the_checkpoint_dir(tmp_path: Path) -> None:
    directory = sbatch_bundle(tmp_path)
    env = slurm_tools(tmp_path)
    done = run_sbatch(directory, env, preempt=False)
    assert done.returncode == 0, explain(done)
    lines = (tmp_path / "srun-env").read_text().splitlines()
    srun_env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert srun_env["CHECKPOINT_DIR"] == str(directory / "checkpoints")
    assert (directory / "checkpoints").is_dir()
    assert srun_env["FSDP_ENV_SHOWN"] == "1" and srun_env["NCCL_DEBUG"] == "WARN"
    assert srun_env["OMP_NUM_THREADS"] == "4"  # SLURM_CPUS_ON_NODE 8 / 2 processes
    assert done.stdout.count("cluster environment") == 1
    assert not (tmp_path / "scontrol").exists(), "a finished job is not requeued"
    failed = run_sbatch(directory, {**env, "FAKE_SRUN": "1"}, preempt=False)
    assert failed.returncode == 1 and not (tmp_path / "scontrol").exists()
    mine = run_sbatch(directory, {**env, "CHECKPOINT_DIR": str(tmp_path / "ck")}, preempt=False)
    assert mine.returncode == 0 and (tmp_path / "ck").is_dir()


def test_sbatch_requeues_after_the_preemption_signal(tmp_path: Path) -> None:
    directory = sbatch_bundle(tmp_path)
    env = slurm_tools(tmp_path)
    result = run_sbatch(directory, env, preempt=True)
    assert result.returncode == 0, explain(result)
    assert (tmp_path / "srun-got").read_text().strip() == "usr1", "the signal reached the job step"
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "42"]
    assert "requeueing job 42 (restart 1)" in result.stdout


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"REQUEUE": "0"}, "REQUEUE=0"),
        ({"MAX_REQUEUES": "2", "SLURM_RESTART_COUNT": "2"}, "MAX_REQUEUES=2"),
        ({"CHECKPOINT_DIR": ""}, "no CHECKPOINT_DIR"),
        ({"FAKE_REQUEUE_RC": "1"}, "scontrol requeue 42 failed"),
    ],
)
def test_sbatch_exits_75_when_it_does_not_requeue(tmp_path: Path, extra: dict[str, str], why: str) -> None:
    directory = sbatch_bundle(tmp_path)
    result = run_sbatch(directory, {**slurm_tools(tmp_path), **extra}, preempt=True)
    assert result.returncode == 75, explain(result)
    assert why in result.stderr
    requeued = (tmp_path / "scontrol").read_text() if (tmp_path / "scontrol").exists() else ""
    assert requeued == ("requeue 42\n" if "FAKE_REQUEUE_RC" in extra else "")


def test_sbatch_refuses_bad_requeue_settings(tmp_path: Path) -> None:
    directory = sbatch_bundle(tmp_path)
    for extra in ({"REQUEUE": "yes"}, {"MAX_REQUEUES": "1; reboot"}):
        result = run_sbatch(directory, {**slurm_tools(tmp_path), **extra}, preempt=False)
        assert result.returncode == 2 and not (tmp_path / "srun-env").exists(), explain(result)


# --------------------------------------------------------------------------------- Kubernetes


def test_the_image_is_the_official_one_for_the_plans_torch(tmp_path: Path) -> None:
    plan = gpu_plan(1)
    assert DEFAULT_IMAGE == "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime" == official_image()
    # The default is the torch the runtime is pinned to (the executor extra).
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"torch=={bundle_module.DEFAULT_TORCH_VERSION}"' in pyproject

    def image(**options: object) -> str:
        pods = PodOptions(**options)
        files = {f.path: f.data.decode() for f in bundle_files(plan, target="k8s", pods=pods)}
        trainer = documents(files["k8s.yaml"])["TrainJob"]["spec"]["trainer"]["image"]
        pod = documents(files["k8s-pytorchjob.yaml"])["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]
        assert pod["template"]["spec"]["containers"][0]["image"] == trainer
        return trainer

    assert image() == DEFAULT_IMAGE
    older = image(torch_version="2.10.0", cuda_version="12.8")
    assert older == "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime"
    assert image(image="registry.example.com/team/train:7") == "registry.example.com/team/train:7"
    for bad, field in (
        ({"torch_version": "latest"}, "torch_version"),
        ({"torch_version": "2.5.1"}, "torch_version"),  # older than the runtime supports
        ({"cuda_version": "12"}, "cuda_version"),
        ({"image": "x; rm -rf /"}, "image"),
    ):
        with pytest.raises(UnsafeValueError) as caught:
            bundle_files(plan, target="k8s", pods=PodOptions(**bad))
        assert caught.value.field == field


def test_rdma_is_a_marked_block_until_asked_for() -> None:
    plain = {f.path: f.data.decode() for f in bundle_files(gpu_plan(2))}
    for name in MANIFESTS:
        assert "# --- RDMA / InfiniBand (optional)" in plain[name]
        assert '#     add: ["IPC_LOCK"]' in plain[name]
    trainer = documents(plain["k8s.yaml"])["TrainJob"]["spec"]["trainer"]
    assert set(trainer["resourcesPerNode"]["limits"]) == {"nvidia.com/gpu"}

    pods = PodOptions(rdma_resource="rdma/rdma_shared_device_a", rdma_count=2)
    rdma = {f.path: f.data.decode() for f in bundle_files(gpu_plan(2), pods=pods)}
    job = documents(rdma["k8s.yaml"])["TrainJob"]["spec"]
    limits = job["trainer"]["resourcesPerNode"]["limits"]
    assert limits == {"nvidia.com/gpu": 8, "rdma/rdma_shared_device_a": 2}
    (patch,) = job["runtimePatches"]
    (container,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["containers"]
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    pod = documents(rdma["k8s-pytorchjob.yaml"])["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]
    (container,) = pod["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == 2
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    for bad in ("rdma", "nvidia.com/gpu", "rdma/ib; rm -rf /", "Rdma/ib"):
        with pytest.raises(UnsafeValueError):
            bundle_files(gpu_plan(2), pods=PodOptions(rdma_resource=bad))
    # CPU plans get no RDMA block (gloo over TCP), and request CPUs instead of GPUs.
    cpu = {f.path: f.data.decode() for f in bundle_files(Plan.model_validate(debug_plan()))}
    assert "RDMA" not in cpu["k8s.yaml"] and "nvidia.com/gpu" not in cpu["k8s.yaml"]


def test_volumes_are_sized_from_the_plan() -> None:
    small = documents(next(f.data.decode() for f in bundle_files(gpu_plan(1)) if f.path == "k8s.yaml"))
    assert small["PersistentVolumeClaim"]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert small["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    # An 8B model with AdamW: 12 bytes a parameter, three checkpoints, a quarter to spare.
    doc = debug_plan(nodes=2, gpus_per_node=8, sharding="hybrid_shard")
    doc["model"]["num_params"] = 8_000_000_000
    big = Plan.model_validate(doc)
    assert bundle_module.checkpoint_gib(big) == 336
    docs = documents(next(f.data.decode() for f in bundle_files(big) if f.path == "k8s-pytorchjob.yaml"))
    assert docs["PersistentVolumeClaim"]["spec"]["resources"]["requests"]["storage"] == "336Gi"
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    master = docs["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    shm = next(v for v in master["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


def test_a_bundle_too_large_for_a_configmap_is_refused_when_rendered(monkeypatch) -> None:
    plan = gpu_plan(1)
    bundle_files(plan, target="k8s")  # fits
    monkeypatch.setattr(bundle_module, "CONFIGMAP_LIMIT_BYTES", 10_000)
    with pytest.raises(BundleTooLargeError, match="more than a Kubernetes ConfigMap holds"):
        bundle_files(plan, target="k8s")
    # The other targets carry no ConfigMap.
    assert {f.path for f in bundle_files(plan, target="slurm")} >= {"launch.sh", "slurm.sbatch"}


def test_the_bundle_readme_documents_the_plumbing() -> None:
    readme = next(f.data.decode() for f in bundle_files(gpu_plan(2)) if f.path == "README.md")
    for needle in ("## Cluster environment", "`NCCL_SOCKET_IFNAME`", "`FSDP_PG_TIMEOUT_S`",
                   "**Time limits and preemption.**", "scontrol requeue", "Exit status:",
                   "/dev/shm", "ReadWriteMany", DEFAULT_IMAGE, "--rdma-resource", "--server-side", "1 MiB"):
        assert needle in readme, needle


# ---------------------------------------------------------------------------- real trainer, CPU


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the trainer processes run in their own sessions, so a process
    group does not reach them; SLURM's cgroup does)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def wait_for_steps(metrics: Path, proc: subprocess.Popen[str], count: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= count:
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the job ended early ({proc.returncode}):\n{out}\n{err}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no training steps in time")


@pytest.mark.distributed
def test_preemption_signals_checkpoint_and_the_next_start_resumes(tmp_path: Path) -> None:
    """SIGUSR1 to every process of the job (what SLURM's --signal does through srun) stops the
    trainer after its step with a checkpoint, and torchrun, which ignores it, exits 0. SIGTERM to
    torchrun alone (a Kubernetes pod deletion) reaches the trainer through torchrun and saves too.
    The next start resumes from the newest checkpoint."""
    plan = make_plan(PlanRequest(
        model=catalog_model("llama-debug"), cluster=ClusterSpec.parse("1x2xcpu"),
        training=TrainingSpec(seq_len=64, global_batch_tokens=64 * 8, precision="fp32"),
        search=SearchSpace(compile=[False]),
    ))
    write_bundle(plan, tmp_path, target="torchrun")
    launch = tmp_path / bundle_name(plan) / "launch.sh"
    checkpoints = tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPROC_PER_NODE", "NNODES")}
    env.update(PYTHON=sys.executable, CHECKPOINT_DIR=str(checkpoints), OMP_NUM_THREADS="1")
    env.update(SYNTHETIC_DATA="1")  # a rehearsal: what is under test is the signal handling

    def start(name: str, steps: int) -> tuple[subprocess.Popen[str], Path]:
        metrics = tmp_path / f"{name}.jsonl"
        proc = subprocess.Popen([str(launch), "--steps", str(steps), "--metrics-file", str(metrics)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return proc, metrics

    def saved() -> list[int]:
        return sorted(int(p.name.split("-")[1]) for p in checkpoints.glob("step-*") if p.name[5:].isdigit())

    # 1. SLURM: SIGUSR1 to every process of the step (torchrun and the trainer processes).
    proc, metrics = start("usr1", 10_000)
    wait_for_steps(metrics, proc, 2)
    for pid in [proc.pid, *descendants(proc.pid)]:
        os.kill(pid, signal.SIGUSR1)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert "stop requested" in out and saved(), out
    first = saved()[-1]

    # 2. Kubernetes: SIGTERM to the container's main process (launch.sh became torchrun).
    proc, metrics = start("term", 10_000)
    wait_for_steps(metrics, proc, 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert f"resumed from {checkpoints / f'step-{first:08d}'}" in out, out
    assert "stop requested" in out, f"{out}\n{err}"
    assert saved()[-1] > first, (saved(), out)
    second = saved()[-1]

    # 3. The next start (a requeued job, a restarted pod) resumes and finishes.
    proc, _ = start("resume", second + 2)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert f"(step {second})" in out and "done: 2 steps" in out, out
