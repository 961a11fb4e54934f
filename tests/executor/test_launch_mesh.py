"""Launch bundles carry the plan's device mesh: a header stating it in every script and manifest, the
bundle README's section on it, and a refusal in launch.sh and slurm.sbatch of a per-node process count
that the tensor-parallel groups cannot tile. Plans come from the planner itself."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from executor.launch.bundle import bundle_files, bundle_name, write_bundle
from planner.catalog.models import resolve_model
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.executor.launch_lint import documents, lint_script, validate_manifest
from tests.executor.test_launch_bundle import check_manifests

SCRIPTS = ("launch.sh", "slurm.sbatch")
MANIFESTS = ("k8s.yaml", "k8s-pytorchjob.yaml")


def debug_plan(*, tp: int, shardings: tuple[str, ...] = ("full_shard", "shard_grad_op")) -> Plan:
    """llama-debug on 2 nodes x 4 CPU ranks, planned with the tensor-parallel degree pinned."""
    request = PlanRequest(
        model=resolve_model("llama-debug"), cluster=ClusterSpec.parse("2x4xcpu"),
        training=TrainingSpec(seq_len=128, global_batch_tokens=128 * 32),
        search=SearchSpace(tensor_parallel_degrees=[tp], shardings=list(shardings)),
    )
    return make_plan(request)


def fake_python(tmp_path: Path) -> Path:
    """An interpreter that passes launch.sh's torch probe and records the torchrun arguments."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\nprintf "%s\\n" "$@" > {tmp_path}/argv\n'
    )
    fake.chmod(0o755)
    return fake


def run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script)], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=60, check=False)


def test_a_tp2_bundle_states_its_mesh_everywhere(tmp_path: Path) -> None:
    plan = debug_plan(tp=2)
    assert (plan.config.mesh.dp_replicate, plan.config.mesh.dp_shard, plan.config.mesh.tp) == (1, 4, 2)
    write_bundle(plan, tmp_path, target="all")
    directory = tmp_path / bundle_name(plan)
    header = "# mesh: dp_replicate 1 x dp_shard 4 x tp 2 = 8 ranks\n"
    groups = "#   tp groups are 2 consecutive ranks inside one node (tensor parallel\n"
    for name in (*SCRIPTS, *MANIFESTS):
        text = (directory / name).read_text()
        assert header + groups in text, name
        # In the header, above the first line that is not a comment (the shebang aside).
        top = [line for line in text.splitlines()[1:] if line.startswith("#")][:6]
        assert header.strip() in top, name
    for script in SCRIPTS:
        lint_script(directory / script)
    for manifest in MANIFESTS:
        validate_manifest(directory / manifest)
    check_manifests(directory, plan)
    readme = (directory / "README.md").read_text()
    assert "## Device mesh\n\n`dp_replicate 1 x dp_shard 4 x tp 2 = 8 ranks`" in readme
    assert "tp groups of 2 **consecutive ranks inside one node**" in readme
    assert "sequence parallel" in readme and "loss parallel" in readme
    assert "`launch.sh` and `slurm.sbatch` refuse an `NPROC_PER_NODE`" in readme


def test_launch_sh_refuses_a_process_count_the_tp_groups_cannot_tile(tmp_path: Path) -> None:
    plan = debug_plan(tp=2)
    write_bundle(plan, tmp_path, target="torchrun")
    launch = tmp_path / bundle_name(plan) / "launch.sh"
    # The plan spans 2 nodes: launch.sh needs node 0's address (it refuses to guess 127.0.0.1).
    env = {"PYTHON": str(fake_python(tmp_path)), "SYNTHETIC_DATA": "1", "MASTER_ADDR": "10.0.0.1"}

    odd = run(launch, {**env, "NPROC_PER_NODE": "3"})
    assert odd.returncode == 2
    assert "NPROC_PER_NODE=3 (GPUs per node) is not a multiple of the plan's tensor-parallel degree 2" \
        in " ".join(odd.stderr.split())
    assert not (tmp_path / "argv").exists()  # torchrun never started

    fine = run(launch, env)  # the plan's 4 per node
    assert fine.returncode == 0, fine.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    # A smaller multiple of tp passes this check (the world-size warning is the trainer's business).
    two = run(launch, {**env, "NPROC_PER_NODE": "2"})
    assert two.returncode == 0 and "not a multiple" not in two.stderr and "warning" in two.stderr


def test_sbatch_refuses_it_before_srun(tmp_path: Path) -> None:
    plan = debug_plan(tp=2)
    write_bundle(plan, tmp_path, target="slurm")
    directory = tmp_path / bundle_name(plan)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("scontrol", "echo node-a; echo node-b"), ("srun", f'echo "$@" > {tmp_path}/srun')):
        (bin_dir / tool).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    slurm = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "42", "BUNDLE_DIR": str(directory)}
    sbatch = directory / "slurm.sbatch"
    # Not a multiple of tp; not a number (bash arithmetic would run the subscript's command).
    for bad in ("3", "1; reboot", f"a[$(touch {tmp_path}/pwned)]"):
        refused = run(sbatch, {**slurm, "NPROC_PER_NODE": bad})
        assert refused.returncode == 2, (bad, refused.stderr)
        assert not (tmp_path / "srun").exists() and not (tmp_path / "pwned").exists()
    assert "NPROC_PER_NODE=3 (GPUs per node) is not a multiple of the plan's tensor-parallel degree 2" in \
        " ".join(run(sbatch, {**slurm, "NPROC_PER_NODE": "3"}).stderr.split())
    started = run(sbatch, slurm)
    assert started.returncode == 0, started.stderr
    assert (tmp_path / "srun").read_text().split()[-1] == str(directory / "launch.sh")


@pytest.mark.parametrize(("tp", "shardings", "mesh"), [
    (1, ("full_shard",), "dp_replicate 1 x dp_shard 8 x tp 1 = 8 ranks (data parallelism only)"),
    (2, ("hybrid_shard",), "dp_replicate 2 x dp_shard 2 x tp 2 = 8 ranks"),
])
def test_other_meshes(tmp_path: Path, tp: int, shardings: tuple[str, ...], mesh: str) -> None:
    plan = debug_plan(tp=tp, shardings=shardings)
    files = {f.path: f.data.decode() for f in bundle_files(plan)}
    for name in (*SCRIPTS, *MANIFESTS):
        assert f"# mesh: {mesh}\n" in files[name], name
        if name in MANIFESTS:
            docs = documents(files[name])
            assert docs["TrainJob" if name == "k8s.yaml" else "PyTorchJob"]["metadata"]["name"]
    assert f"`{mesh.split(' (')[0]}`" in files["README.md"]
    if tp == 1:  # nothing to tile: no check, and the scripts are as before tensor parallelism
        assert "tensor-parallel degree" not in files["launch.sh"]
        write_bundle(plan, tmp_path, target="torchrun")
        odd = run(tmp_path / bundle_name(plan) / "launch.sh",
                  {"PYTHON": str(fake_python(tmp_path)), "NPROC_PER_NODE": "3", "SYNTHETIC_DATA": "1",
                   "MASTER_ADDR": "10.0.0.1"})
        assert odd.returncode == 0 and "not a multiple" not in odd.stderr
    else:
        assert "multiple of 2 processes per node" in " ".join(files["launch.sh"].split())
