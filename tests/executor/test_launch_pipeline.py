"""Launch bundles of a pipeline plan (pp > 1): every script and manifest states the mesh and the pipeline
(schedule, stages, blocks per stage), the bundle README lists the stages, and launch.sh / slurm.sbatch
refuse a world that is not the mesh's product or a per-node process count that splits a stage across
nodes. The pp plans are built from a real plan with the contract's dataclasses (tests/pipeline_plans.py)."""

from __future__ import annotations

import os
from pathlib import Path

from executor.launch.bundle import bundle_files, bundle_name, write_bundle
from planner.search import make_plan
from tests.executor.launch_lint import lint_script, validate_manifest
from tests.executor.test_launch_mesh import MANIFESTS, SCRIPTS, fake_python, run
from tests.pipeline_plans import pipeline_plan, pipeline_request


def words(text: str) -> str:
    return " ".join(text.split())


def test_a_pp2_bundle_states_its_mesh_and_pipeline_everywhere(tmp_path: Path) -> None:
    _, plan = pipeline_plan("1F1B", pp=2, world=8, nodes=2)
    write_bundle(plan, tmp_path, target="all")
    directory = tmp_path / bundle_name(plan)
    header = (
        "# mesh: pp 2 x dp_replicate 1 x dp_shard 4 x tp 1 = 8 ranks\n"
        "# pipeline: 1F1B, 2 stages, 1 per pipeline rank, blocks per stage 1/3\n"
        "#   (the first stage also runs the embeddings, the last the head and the loss). Pipeline rank p\n"
        "#   is the p-th block of 4 consecutive ranks (pp outermost): the world must be\n"
        "#   exactly 8 ranks, each stage on 1 whole node(s) in node order.\n"
    )
    for name in (*SCRIPTS, *MANIFESTS):
        assert header in (directory / name).read_text(), name
    for script in SCRIPTS:
        lint_script(directory / script)
    for manifest in MANIFESTS:
        validate_manifest(directory / manifest)
    readme = (directory / "README.md").read_text()
    assert "## Device mesh\n\n`pp 2 x dp_replicate 1 x dp_shard 4 x tp 1 = 8 ranks`" in readme
    assert "No tensor parallelism (tp 1)" in readme and "Data parallelism only" not in readme
    assert "### Pipeline\n\n`1F1B` over 2 pipeline ranks, 2 stages" in readme
    assert "| 0 | 0 | 0–0 |\n| 1 | 1 | 1–3 |" in readme
    assert "The plan puts each stage on 1 whole node(s) in node order" in words(readme)


def test_the_v_and_looped_stage_maps_in_the_readme() -> None:
    looped, v_shape = (0, 1, 0, 1), (0, 1, 1, 0)  # the pipeline rank of each stage
    for schedule, ranks in (("Interleaved1F1B", looped), ("ZBVZeroBubble", v_shape)):
        table = "\n".join(f"| {stage} | {rank} | {stage}–{stage} |" for stage, rank in enumerate(ranks))
        _, plan = pipeline_plan(schedule)  # type: ignore[arg-type]
        files = {f.path: f.data.decode() for f in bundle_files(plan)}
        assert table in files["README.md"], schedule
        assert f"# pipeline: {schedule}, 4 stages, 2 per pipeline rank, blocks per stage 1/1/1/1\n" \
            in files["launch.sh"]


def test_launch_sh_refuses_a_world_that_is_not_the_mesh(tmp_path: Path) -> None:
    _, plan = pipeline_plan("1F1B", pp=2, world=8, nodes=2)
    write_bundle(plan, tmp_path, target="torchrun")
    launch = tmp_path / bundle_name(plan) / "launch.sh"
    env = {"PYTHON": str(fake_python(tmp_path)), "SYNTHETIC_DATA": "1", "MASTER_ADDR": "10.0.0.1"}
    small = run(launch, {**env, "NNODES": "1"})
    assert small.returncode == 2
    assert "1 node(s) x 4 process(es) = 4 ranks, but the plan's mesh is pp 2 x dp_replicate 1 x dp_shard 4 " \
           "x tp 1 = 8 ranks: run 2 node(s) x 4 processes" in words(small.stderr)
    assert not (tmp_path / "argv").exists()  # torchrun never started
    # Other shapes of the same world keep every stage on whole nodes: 4 nodes x 2, 1 node x 8.
    for nodes, per_node in (("4", "2"), ("1", "8")):
        fine = run(launch, {**env, "NNODES": nodes, "NPROC_PER_NODE": per_node})
        assert fine.returncode == 0, fine.stderr


def test_a_process_count_that_splits_a_stage_across_nodes_is_refused(tmp_path: Path) -> None:
    # pp 3 over 3 nodes x 4: each stage is one node. 2 nodes x 6 is the world, but node 0 would hold
    # stage 0 and half of stage 1.
    _, plan = pipeline_plan("1F1B", pp=3, world=12, nodes=3)
    write_bundle(plan, tmp_path, target="torchrun")
    launch = tmp_path / bundle_name(plan) / "launch.sh"
    env = {"PYTHON": str(fake_python(tmp_path)), "SYNTHETIC_DATA": "1", "MASTER_ADDR": "10.0.0.1"}
    split = run(launch, {**env, "NNODES": "2", "NPROC_PER_NODE": "6"})
    assert split.returncode == 2
    needle = "NPROC_PER_NODE=6 would split the plan's pipeline stages of 4 ranks across nodes"
    assert needle in words(split.stderr)
    assert run(launch, {**env, "NNODES": "6", "NPROC_PER_NODE": "2"}).returncode == 0


def test_sbatch_refuses_it_before_srun(tmp_path: Path) -> None:
    _, plan = pipeline_plan("1F1B", pp=2, world=8, nodes=2)
    write_bundle(plan, tmp_path, target="slurm")
    directory = tmp_path / bundle_name(plan)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("scontrol", "echo node-a; echo node-b"), ("srun", f'echo "$@" > {tmp_path}/srun')):
        (bin_dir / tool).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    slurm = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
             "SLURM_JOB_ID": "42", "BUNDLE_DIR": str(directory)}
    refused = run(directory / "slurm.sbatch", {**slurm, "SLURM_JOB_NUM_NODES": "3"})
    assert refused.returncode == 2 and "= 12 ranks, but the plan's mesh is pp 2" in words(refused.stderr)
    assert not (tmp_path / "srun").exists()
    started = run(directory / "slurm.sbatch", {**slurm, "SLURM_JOB_NUM_NODES": "2"})
    assert started.returncode == 0, started.stderr


def test_a_plan_without_a_pipeline_has_no_pipeline_lines() -> None:
    flat = make_plan(pipeline_request())
    assert flat.config.mesh.pp == 1
    files = {f.path: f.data.decode() for f in bundle_files(flat)}
    for name in (*SCRIPTS, *MANIFESTS, "README.md"):
        assert "pipeline" not in files[name].lower(), name
