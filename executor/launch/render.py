"""The bundle's text files: launch.sh (torchrun), slurm.sbatch, k8s.yaml (TrainJob), k8s-pytorchjob.yaml,
skypilot.yaml, README.md. Each renderer takes a LaunchContext whose fields are already validated or quoted."""

from __future__ import annotations

import json
from dataclasses import dataclass

from contract.float8 import TORCHAO_REQUIREMENT
from contract.mesh import AXES, MESH_AXES, Axis, Mesh
from contract.parallel_config import PipelineConfig
from executor.launch import environment, manifests, skypilot, vendors
from executor.launch.manifests import CHECKPOINT_MOUNT, WORK_DIR, KubeContext
from executor.launch.quoting import comment
from executor.launch.templating import render_template
from planner.catalog.gpus import FP8_GPUS, MX_GPUS


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """What the templates need from a plan, in safe forms."""

    title: str
    """Comment-safe one-line description (model, cluster, strategy)."""
    plan_hash: str
    """Validated hex digest."""
    short_hash: str
    """First 12 hex digits (rendezvous id, file names)."""
    job_name: str
    """Slug for SLURM job names."""
    k8s_name: str
    """DNS-1123 label for Kubernetes objects."""
    num_nodes: int
    gpus_per_node: int
    gpu: str
    """Comment-safe GPU name."""
    uses_gpus: bool
    """False for `cpu` plans (no GPU resource requests, gloo)."""
    image: str
    """Validated container image reference."""
    label: str
    """Comment-safe strategy label (e.g. `full_shard/8 u2 AC=sel2 mb2x4 compiled`)."""
    mesh: Mesh | None = None
    """The training plan's mesh (None: a calibration run, which has none)."""
    float8: str = "none"
    """The plan's Float8 recipe (`config.float8`: none, tensorwise, rowwise, mxfp8; a checked choice)."""
    async_tp: bool = False
    """The plan's async tensor parallelism (`config.async_tp`)."""
    pipeline: PipelineConfig | None = None
    """The plan's pipeline (`config.pipeline`, present when mesh.pp > 1; its schedule a checked choice)."""
    pure_bf16: bool = False
    """The plan trains in pure bf16 (`training.state_dtype` bfloat16: no fp32 master)."""
    stack: vendors.Stack = vendors.NVIDIA
    """The GPU vendor's stack (CUDA and NCCL, or ROCm and RCCL): the image, the resource, the
    environment the scripts and manifests set."""
    domain_nodes: int = 1
    """Nodes per scale-up domain where one spans several nodes and tiles the job (18 on a GB200 NVL72
    rack): the plan lays its ranks domain after domain, so the scheduler is asked for whole domains
    (SLURM's `--segment`, Kueue's pod-set slices). 1: a domain is a node, nothing to ask."""
    domain_gpus: int = 0
    """GPUs per scale-up domain where the plan's cluster has one that spans nodes (72 on GB200 NVL72; the
    job's GPUs where it is smaller): tensor-parallel groups stay inside it, across nodes. 0: a domain is
    a node."""


FLOAT8_GPUS = {"mxfp8": f"compute capability 10.0+: {MX_GPUS}"}
"""GPUs each Float8 recipe needs (default: FLOAT8_ANY_GPU)."""
FLOAT8_ANY_GPU = f"compute capability 8.9+, or AMD Instinct gfx942+: {FP8_GPUS}"
"""The GPUs the tensorwise and rowwise recipes train on (torchao's float8 GEMMs): the catalog's with
float8 tensor cores."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What a torchrun script starts: the training run, or a calibration run."""

    script: str
    """File name of the torchrun script (`launch.sh`)."""
    module: str
    """Python module every process runs."""
    args: str
    """Its fixed arguments, as bash words (paths under $HERE, the bundle directory)."""
    usage: str
    """The usage line shown at the top of the scripts."""
    resumable: bool
    """Whether CHECKPOINT_DIR makes the run save and resume checkpoints."""
    reads_data: bool = False
    """Whether the run trains on data: DATA / SYNTHETIC_DATA choose it, and one of them is required."""
    example_options: str = "--steps 1000"
    """Options the scripts' usage examples pass (the torchtitan target's are torchtitan's)."""
    carries: str = "launch.sh, plan.json, the runtime"
    """What the bundle's Kubernetes ConfigMap carries, as the manifests' comments and README name it."""
    k8s_options: str = "--data /data/ds --steps 1000"
    """Options the manifests' comments show after the "launch" placeholder of the container's args."""
    checkpoints: str = "CHECKPOINT_DIR: a restarted pod resumes from the newest"
    """How the run uses the checkpoint claim mounted at CHECKPOINT_DIR (the manifests' comments)."""
    requirement: str = ""
    """A package the image must add to torch, which launch.sh checks for (`torchtitan==0.3.0`; '': none)."""
    requirement_module: str = ""
    """The module launch.sh imports to check for it."""


TRAIN = Entry(
    script="launch.sh",
    module="executor.runtime.train",
    args='--plan "$HERE/plan.json"',
    usage="DATA=/path/to/dataset ./launch.sh [trainer options]   e.g. DATA=/data/ds ./launch.sh --steps 1000",
    resumable=True,
    reads_data=True,
)


def _header_values(ctx: LaunchContext) -> dict[str, object]:
    """What the header every script and manifest opens with needs (templates/parts/plan_header.sh.j2)."""
    return {
        "ctx": ctx,
        "mesh_header": _mesh_header(ctx),
        "float8_header": _float8_header(ctx),
        "pure_bf16_header": _pure_bf16_header(ctx),
    }


def _mesh_header(ctx: LaunchContext) -> str:
    """Header comment lines stating the mesh and its pipeline ('' without a mesh)."""
    mesh = ctx.mesh
    if mesh is None:
        return ""
    text = render_template(
        "parts/mesh_header.sh.j2",
        mesh=mesh,
        data_parallel_only=mesh.model_parallel == 1,
        async_tp=ctx.async_tp,
        **_domain_values(ctx),
    )
    return text + _pipeline_header(ctx)


def _pipeline_header(ctx: LaunchContext) -> str:
    """Header comment lines stating the pipeline ('' without one): schedule, stages, blocks per stage."""
    if ctx.mesh is None or ctx.pipeline is None:
        return ""
    return render_template(
        "parts/pipeline_header.sh.j2", mesh=ctx.mesh, pipeline=ctx.pipeline, stage_layout=_stage_layout(ctx)
    )


def _stages_tile_nodes(ctx: LaunchContext) -> bool:
    """Whether the plan's own layout puts every pipeline stage on whole nodes (several nodes per stage,
    or several stages per node): then a per-node process count that breaks it is refused."""
    stage = ctx.mesh.stage_ranks if ctx.mesh is not None else 0
    return stage > 0 and (stage % ctx.gpus_per_node == 0 or ctx.gpus_per_node % stage == 0)


def _stage_layout(ctx: LaunchContext) -> str:
    """How the pipeline stages lie on the nodes, as a phrase ('' when they do not tile the nodes)."""
    if ctx.mesh is None or not _stages_tile_nodes(ctx):
        return ""
    return render_template(
        "parts/stage_layout.j2", stage=ctx.mesh.stage_ranks, gpus_per_node=ctx.gpus_per_node
    )


def _mesh_checks(ctx: LaunchContext, script: str) -> list[str]:
    """The bash refusals of a world the plan's mesh cannot run on, innermost axis first, each from the
    registry (contract/mesh.py): a node check per axis whose groups stay inside a node (`within_node`),
    a world check per axis the plan lays over the nodes (`fixed_layout`: the pipeline's stages)."""
    if ctx.mesh is None:
        return []
    checks = []
    for entry in reversed(AXES):
        if ctx.mesh.degree(entry.name) == 1:
            continue
        if entry.within_node:
            checks.append(_within_node_check(ctx, script, entry))
        if entry.fixed_layout:
            checks.append(_fixed_layout_check(ctx, script, entry))
    return checks


def _fixed_layout_check(ctx: LaunchContext, script: str, entry: Axis) -> str:
    """Bash that refuses a world the axis's groups cannot be laid on (the pipeline's stages): its size
    must be the mesh's product (the groups cannot be re-laid), and where the plan puts each group on
    whole nodes, the per-node process count must keep them there."""
    assert ctx.mesh is not None
    return render_template(
        "parts/pipeline_check.sh.j2",
        script=script,
        mesh=ctx.mesh,
        axis=entry,
        degree=ctx.mesh.degree(entry.name),
        stage=ctx.mesh.stage_ranks,
        stages_tile_nodes=_stages_tile_nodes(ctx),
        num_nodes=ctx.num_nodes,
        gpus_per_node=ctx.gpus_per_node,
    )


def _within_node_check(ctx: LaunchContext, script: str, entry: Axis) -> str:
    """Bash that refuses a per-node process count the axis's groups cannot tile (tp: they stay inside a
    node, or inside a scale-up domain that spans nodes, where a group may span whole nodes)."""
    assert ctx.mesh is not None
    return render_template(
        "parts/within_node_check.sh.j2",
        script=script,
        axis=entry,
        degree=ctx.mesh.degree(entry.name),
        gpus_per_node=ctx.gpus_per_node,
        **_domain_values(ctx),
    )


def _domain_values(ctx: LaunchContext) -> dict[str, object]:
    """What the text about groups that stay inside a scale-up domain needs (templates/parts/
    tp_span.j2): the domain's GPUs where it spans nodes (0: a node) and its fabric's name."""
    return {"domain_gpus": ctx.domain_gpus, "fabric": ctx.stack.fabric}


def _float8_header(ctx: LaunchContext) -> str:
    """Header comment lines stating a Float8 plan's precision and requirements ('' without Float8)."""
    if ctx.float8 == "none":
        return ""
    gpus = FLOAT8_GPUS.get(ctx.float8, FLOAT8_ANY_GPU)
    return render_template(
        "parts/float8_header.sh.j2", recipe=ctx.float8, torchao=TORCHAO_REQUIREMENT, gpus=gpus
    )


def _pure_bf16_header(ctx: LaunchContext) -> str:
    """Header comment lines stating that a plan trains in pure bf16 ('' in mixed precision)."""
    return render_template("parts/pure_bf16_header.sh.j2") if ctx.pure_bf16 else ""


def _float8_check(ctx: LaunchContext, script: str) -> str:
    """Bash that refuses to start a Float8 plan where torchao is missing ('' without Float8)."""
    if ctx.float8 == "none":
        return ""
    return render_template(
        "parts/float8_check.sh.j2", script=script, recipe=ctx.float8, torchao=TORCHAO_REQUIREMENT
    )


def launch_sh(ctx: LaunchContext, entry: Entry = TRAIN) -> str:
    """The torchrun script (launch.sh, or the calibration's calibrate.sh) every node runs."""
    return render_template(
        "launch.sh.j2",
        entry=entry,
        cluster_env=environment.shown(ctx.stack.vendor),
        mesh_checks=_mesh_checks(ctx, entry.script),
        float8_check=_float8_check(ctx, entry.script),
        **_header_values(ctx),
    )


SIGNAL_LEAD_S = environment.TERMINATION_GRACE_S
"""SLURM sends SIGUSR1 this many seconds before the job's end (--signal=B:USR1@...)."""
EXIT_NOT_REQUEUED = 75
"""slurm.sbatch: stopped by SIGUSR1 with a checkpoint, but not requeued (EX_TEMPFAIL: submit again)."""


def _sbatch_options(ctx: LaunchContext, entry: Entry) -> dict[str, str | int | None]:
    """The #SBATCH options, in order (None: a flag without a value)."""
    options: dict[str, str | int | None] = {
        "job-name": ctx.job_name,
        "nodes": ctx.num_nodes,
        "ntasks-per-node": 1,
    }
    if ctx.uses_gpus:
        options["gpus-per-node"] = ctx.gpus_per_node
    if ctx.domain_nodes > 1:
        # The topology/block plugin's segments: each a set of nodes inside one block (NVLink domain).
        options["segment"] = ctx.domain_nodes
    options |= {"exclusive": None, "output": "%x-%j.out"}
    if entry.resumable:
        # SIGUSR1 to the batch shell before the time limit, then requeued under the same job id.
        options |= {"signal": f"B:USR1@{SIGNAL_LEAD_S}", "requeue": None, "open-mode": "append"}
    return options


def slurm_sbatch(ctx: LaunchContext, entry: Entry = TRAIN) -> str:
    """The SLURM batch script: one srun task per node runs the torchrun script."""
    return render_template(
        "slurm.sbatch.j2",
        entry=entry,
        cluster_env=environment.shown(ctx.stack.vendor),
        sbatch_options=_sbatch_options(ctx, entry),
        mesh_checks=_mesh_checks(ctx, "sbatch"),
        signal_lead_s=SIGNAL_LEAD_S,
        exit_not_requeued=EXIT_NOT_REQUEUED,
        **_header_values(ctx),
    )


def k8s_trainjob(ctx: LaunchContext, kube: KubeContext, entry: Entry = TRAIN) -> str:
    """k8s.yaml: the checkpoint claim, a Kubeflow Trainer v2 TrainJob, and the ConfigMap of the bundle
    (whose launch.sh starts `entry`)."""
    return _manifest(ctx, kube, manifests.train_job(ctx, kube), entry)


def k8s_pytorchjob(ctx: LaunchContext, kube: KubeContext, entry: Entry = TRAIN) -> str:
    """k8s-pytorchjob.yaml: the same with a Training Operator v1 PyTorchJob (clusters without Trainer v2)."""
    return _manifest(ctx, kube, manifests.pytorch_job(ctx, kube), entry)


def k8s_example_args(entry: Entry) -> str:
    """The container's args with the entry's example options, as the manifests' comments show them."""
    return json.dumps(["launch", *entry.k8s_options.split()])


def _manifest(ctx: LaunchContext, kube: KubeContext, job: manifests.Document, entry: Entry) -> str:
    """The manifest's three documents, dumped between their comments (templates/k8s.yaml.j2)."""
    _, unset = environment.k8s_env(ctx.stack.vendor)
    return render_template(
        "k8s.yaml.j2",
        entry=entry,
        example_args=k8s_example_args(entry),
        kube=kube,
        claim=manifests.checkpoint_claim(ctx, kube),
        job=job,
        config_map=manifests.bundle_config_map(ctx, kube),
        unset_env=unset,
        rdma_example=manifests.RDMA_EXAMPLE,
        work_dir=WORK_DIR,
        bundle_mount=manifests.BUNDLE_MOUNT,
        checkpoint_mount=CHECKPOINT_MOUNT,
        termination_grace_s=environment.TERMINATION_GRACE_S,
        torchao=TORCHAO_REQUIREMENT,
        **_header_values(ctx),
    )


def skypilot_task(ctx: LaunchContext, sky: skypilot.SkyContext) -> str:
    """skypilot.yaml: the SkyPilot task (templates/skypilot.yaml.j2 around skypilot.task's data)."""
    return render_template(
        "skypilot.yaml.j2",
        task=skypilot.task(ctx, sky),
        sky=sky,
        task_file=skypilot.TASK_FILE,
        requirements_file=skypilot.REQUIREMENTS_FILE,
        torchao=TORCHAO_REQUIREMENT,
        **_header_values(ctx),
    )


def readme(
    ctx: LaunchContext,
    *,
    targets: list[str],
    prediction: str,
    kube: KubeContext | None = None,
    sky: skypilot.SkyContext | None = None,
    sky_missing: str = "",
    entry: Entry = TRAIN,
) -> str:
    """The bundle's README.md: how to run each of its targets, its mesh, the cluster environment
    (`sky_missing`: why a bundle for every target has no SkyPilot task)."""
    return render_template(
        "README.md.j2",
        ctx=ctx,
        entry=entry,
        example_args=k8s_example_args(entry),
        targets=targets,
        prediction=prediction,
        kube=kube,
        sky=sky,
        sky_missing=sky_missing,
        cluster_env=environment.shown(ctx.stack.vendor),
        signal_lead_s=SIGNAL_LEAD_S,
        exit_not_requeued=EXIT_NOT_REQUEUED,
        work_dir=WORK_DIR,
        checkpoint_mount=CHECKPOINT_MOUNT,
        termination_grace_s=environment.TERMINATION_GRACE_S,
        **_readme_mesh_values(ctx),
    )


def _readme_mesh_values(ctx: LaunchContext) -> dict[str, object]:
    """What the README's Device mesh section needs: the mesh, its axes in device-mesh order, and the
    pipeline's stages (templates/parts/readme_mesh.md.j2; no section without a mesh)."""
    mesh = ctx.mesh
    return {
        "mesh": mesh,
        "mesh_axes": MESH_AXES,
        "data_parallel_only": mesh is not None and mesh.model_parallel == 1,
        **_domain_values(ctx),
        **_readme_pipeline_values(ctx),
    }


def _readme_pipeline_values(ctx: LaunchContext) -> dict[str, object]:
    """The README's pipeline table: (stage, pipeline rank, first block, last block) for each stage."""
    pipeline = ctx.pipeline
    if ctx.mesh is None or pipeline is None:
        return {"pipeline": None}
    ranks = pipeline.stage_ranks(ctx.mesh.pp)
    starts = pipeline.first_blocks()
    rows = [
        (stage, ranks[stage], starts[stage], starts[stage] + count - 1)
        for stage, count in enumerate(pipeline.stage_blocks)
    ]
    return {"pipeline": pipeline, "stage_rows": rows, "stage_layout": _stage_layout(ctx)}


__all__ = [
    "KubeContext",
    "LaunchContext",
    "comment",
    "k8s_pytorchjob",
    "k8s_trainjob",
    "launch_sh",
    "readme",
    "skypilot_task",
    "slurm_sbatch",
]
