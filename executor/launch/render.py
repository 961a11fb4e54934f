"""The bundle's text files: launch.sh (torchrun), slurm.sbatch, k8s.yaml (TrainJob), k8s-pytorchjob.yaml,
README.md. Each renderer takes a LaunchContext whose fields are already validated or quoted."""

from __future__ import annotations

from dataclasses import dataclass

from contract.float8 import TORCHAO_REQUIREMENT
from contract.mesh import MESH_AXES, Mesh
from contract.parallel_config import PipelineConfig
from executor.launch import environment
from executor.launch.quoting import comment, yaml_str
from executor.launch.templating import render_template


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


FLOAT8_GPUS = {"mxfp8": "compute capability 10.0+: B200"}
"""GPUs each Float8 recipe needs (default: compute capability 8.9+: L40S, H100, H200, B200)."""


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
        data_parallel_only=mesh.tp == 1 and mesh.pp == 1 and mesh.cp == 1,
        async_tp=ctx.async_tp,
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
    """The bash refusals of a world the plan's mesh cannot run on, one per axis that has one."""
    checks = (_tensor_parallel_check(ctx, script), _pipeline_check(ctx, script))
    return [check for check in checks if check]


def _pipeline_check(ctx: LaunchContext, script: str) -> str:
    """Bash that refuses a world the pipeline cannot run on ('' without a pipeline): its size must be the
    mesh's product (the stages cannot be re-laid), and where the plan puts its stages on whole nodes,
    the per-node process count must keep them there."""
    if ctx.mesh is None or ctx.mesh.pp == 1:
        return ""
    return render_template(
        "parts/pipeline_check.sh.j2",
        script=script,
        mesh=ctx.mesh,
        stage=ctx.mesh.stage_ranks,
        stages_tile_nodes=_stages_tile_nodes(ctx),
        num_nodes=ctx.num_nodes,
        gpus_per_node=ctx.gpus_per_node,
    )


def _tensor_parallel_check(ctx: LaunchContext, script: str) -> str:
    """Bash that refuses a per-node process count the tp groups cannot tile ('' when tp is 1)."""
    if ctx.mesh is None or ctx.mesh.tp == 1:
        return ""
    return render_template(
        "parts/tensor_parallel_check.sh.j2", script=script, tp=ctx.mesh.tp, gpus_per_node=ctx.gpus_per_node
    )


def _float8_header(ctx: LaunchContext) -> str:
    """Header comment lines stating a Float8 plan's precision and requirements ('' without Float8)."""
    if ctx.float8 == "none":
        return ""
    gpus = FLOAT8_GPUS.get(ctx.float8, "compute capability 8.9+: L40S, H100, H200, B200")
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
        env_header=environment.header(),
        mesh_checks=_mesh_checks(ctx, entry.script),
        float8_check=_float8_check(ctx, entry.script),
        cluster_env=environment.bash_defaults(entry.script, cores="$(nproc 2>/dev/null || echo 1)"),
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
        env_header=environment.header(),
        sbatch_options=_sbatch_options(ctx, entry),
        mesh_checks=_mesh_checks(ctx, "sbatch"),
        cluster_env=environment.bash_defaults(
            "sbatch", cores="${SLURM_CPUS_ON_NODE:-$(nproc 2>/dev/null || echo 1)}"
        ),
        signal_lead_s=SIGNAL_LEAD_S,
        exit_not_requeued=EXIT_NOT_REQUEUED,
        **_header_values(ctx),
    )


@dataclass(frozen=True, slots=True)
class KubeContext:
    """What the Kubernetes manifests need beyond LaunchContext (validated by bundle.py)."""

    torch_version: str
    """The torch the image carries (e.g. `2.13.0`): stated in the header."""
    bundle_b64: str
    """base64 of the bundle archive (launch.sh, plan.json, runtime) the ConfigMap carries."""
    bundle_bytes: int
    """Its size before base64 (what counts against the ConfigMap limit)."""
    checkpoint_gib: int
    """Size requested by the checkpoint PersistentVolumeClaim."""
    shm_gib: int
    """sizeLimit of the memory-backed /dev/shm."""
    rdma_resource: str | None = None
    """Extended resource of the RDMA device plugin (None: the block is rendered commented out)."""
    rdma_count: int = 1


BUNDLE_MOUNT = "/etc/fsdp-bundle"
"""Where the ConfigMap (one file, bundle.tar.gz) is mounted, read-only."""
WORK_DIR = "/tmp/fsdp-bundle"
"""Where each pod unpacks it (writable: metrics files and the like land beside launch.sh)."""
CHECKPOINT_MOUNT = "/checkpoints"
"""Where the checkpoint PersistentVolumeClaim is mounted: CHECKPOINT_DIR in the pods."""
RDMA_EXAMPLE = "rdma/rdma_shared_device_a"

# Every pod unpacks the ConfigMap's archive into a writable directory and runs launch.sh there.
_UNPACK = (
    f"set -euo pipefail; mkdir -p {WORK_DIR} && cd {WORK_DIR} && "
    f'tar -xzf {BUNDLE_MOUNT}/bundle.tar.gz && exec ./launch.sh "$@"'
)


def _lines(text: str, indent: int) -> str:
    """`text` (lines without indentation) indented by `indent` spaces."""
    pad = " " * indent
    return "".join(f"{pad}{line}\n" if line else "\n" for line in text.splitlines())


def _env_yaml(entries: list[tuple[str, str]], indent: int, optional: tuple[str, ...] = ()) -> str:
    pad = " " * indent
    out = "".join(f"{pad}- name: {name}\n{pad}  value: {yaml_str(value)}\n" for name, value in entries)
    if optional:
        out += f"{pad}# Unset unless you set them (launch.sh's header says what each does):\n"
        out += "".join(f'{pad}# - name: {name}\n{pad}#   value: ""\n' for name in optional)
    return out


def _pod_env(ctx: LaunchContext) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    given, optional = environment.k8s_env()
    entries = [
        ("NNODES", str(ctx.num_nodes)),
        ("NPROC_PER_NODE", str(ctx.gpus_per_node)),
        ("RDZV_ID", ctx.k8s_name),
        ("CHECKPOINT_DIR", CHECKPOINT_MOUNT),
        *given,
    ]
    return entries, tuple(optional)


def _resources_yaml(ctx: LaunchContext, kube: KubeContext, indent: int) -> str:
    if ctx.uses_gpus:
        text = f"limits:\n  nvidia.com/gpu: {ctx.gpus_per_node}\n"
    else:
        text = f"requests:\n  cpu: {ctx.gpus_per_node}\n"
        if kube.rdma_resource:
            text += "limits:\n"
    if kube.rdma_resource:
        text += "  # RDMA / InfiniBand adapters for NCCL (rendered with --rdma-resource)\n"
        text += f"  {kube.rdma_resource}: {kube.rdma_count}\n"
    elif ctx.uses_gpus:
        text += (
            "  # --- RDMA / InfiniBand (optional) ---------------------------------------------------\n"
            "  # Uncomment with the resource your RDMA device plugin advertises (e.g.\n"
            f"  # {RDMA_EXAMPLE} from the k8s-rdma-shared-dev-plugin, rdma/ib, or an SR-IOV\n"
            "  # resource such as nvidia.com/hostdev), and the IPC_LOCK capability below; set\n"
            "  # NCCL_IB_HCA in env to the adapters. Or render with --rdma-resource NAME.\n"
            f"  # {RDMA_EXAMPLE}: 1\n"
            "  # -------------------------------------------------------------------------------------\n"
        )
    return _lines(text, indent)


def _security_yaml(ctx: LaunchContext, kube: KubeContext, indent: int) -> str:
    """IPC_LOCK (RDMA memory registration): set with an RDMA resource, else a commented hint."""
    if kube.rdma_resource:
        return _lines(
            'securityContext:\n  capabilities:\n    add: ["IPC_LOCK"]  # RDMA: pinned memory\n', indent
        )
    if ctx.uses_gpus:
        return _lines(
            "# securityContext:          # RDMA (see resources): lets NCCL pin memory for the adapters\n"
            '#   capabilities:\n#     add: ["IPC_LOCK"]\n',
            indent,
        )
    return ""


def _volumes_yaml(ctx: LaunchContext, kube: KubeContext, indent: int) -> str:
    return _lines(
        f"""- name: bundle
  configMap:
    name: {ctx.k8s_name}-bundle
- name: dshm  # NCCL and torch share memory between a node's processes through /dev/shm
  emptyDir:
    medium: Memory
    sizeLimit: {kube.shm_gib}Gi
- name: checkpoints
  persistentVolumeClaim:
    claimName: {ctx.k8s_name}-checkpoints
""",
        indent,
    )


def _mounts_yaml(indent: int) -> str:
    return _lines(
        f"""- name: bundle
  mountPath: {BUNDLE_MOUNT}
  readOnly: true
- name: dshm
  mountPath: /dev/shm
- name: checkpoints
  mountPath: {CHECKPOINT_MOUNT}
""",
        indent,
    )


def _k8s_header(ctx: LaunchContext, kube: KubeContext, *, what: str, apply: str, extra: str) -> str:
    return f"""# {what} generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}{_float8_header(ctx)}{_pure_bf16_header(ctx)}#
#   {apply}
# Three objects: the checkpoint PersistentVolumeClaim, the job, and the ConfigMap that carries the
# bundle (launch.sh, plan.json, the runtime: {kube.bundle_bytes:,} bytes as bundle.tar.gz; a ConfigMap holds
# at most 1 MiB). Every pod unpacks it into {WORK_DIR} and runs launch.sh, which sets the cluster
# environment (listed in env below: edit a value there to override it).
# --server-side: a client-side apply copies each object into an annotation limited to 256 KiB.
# Trainer options go in `args` after the "launch" placeholder; name the training data there (a path the
# pods mount), e.g. ["launch", "--data", "/data/ds", "--steps", "1000"], or "--synthetic-data".
# image: the official PyTorch image for torch {kube.torch_version}, the version the plan was made for
#   (`fsdp-planner launcher --torch-version X.Y.Z --cuda-version A.B`, or --image for your own image
#   with torch and your --model-factory code).{_k8s_float8_image(ctx)}
# Volumes: /dev/shm in memory ({kube.shm_gib} GiB at most), checkpoints on the claim at {CHECKPOINT_MOUNT}
#   (CHECKPOINT_DIR: a restarted pod resumes from the newest). Pod deletion sends SIGTERM: every rank
#   saves, with {environment.TERMINATION_GRACE_S} s of grace.
{extra}"""


def _k8s_float8_image(ctx: LaunchContext) -> str:
    if ctx.float8 == "none":
        return ""
    return (
        f"\n# Float8 ({ctx.float8}): the official image has no torchao; use --image with one that has"
        f"\n#   {TORCHAO_REQUIREMENT} (launch.sh refuses to start without it)."
    )


def _pvc_yaml(ctx: LaunchContext, kube: KubeContext) -> str:
    shared = ctx.num_nodes > 1
    access = "ReadWriteMany" if shared else "ReadWriteOnce"
    why = (
        "every node's pod writes its shards into the same checkpoint: the claim needs ReadWriteMany\n"
        "# storage (NFS, CephFS, a Lustre/GPFS CSI driver, a cloud filestore): set storageClassName to one"
        if shared
        else "one pod writes it (ReadWriteOnce); set storageClassName for a class other than the default"
    )
    return f"""---
# Checkpoint storage: {why}.
# {kube.checkpoint_gib} GiB: the trainer keeps two checkpoints and writes a third before deleting the oldest.
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {ctx.k8s_name}-checkpoints
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
spec:
  accessModes: ["{access}"]
  # storageClassName: ""
  resources:
    requests:
      storage: {kube.checkpoint_gib}Gi
"""


def _configmap_yaml(ctx: LaunchContext, kube: KubeContext) -> str:
    return f"""---
# The bundle: launch.sh, plan.json and executor/runtime as one tar.gz (mounted at {BUNDLE_MOUNT}).
apiVersion: v1
kind: ConfigMap
metadata:
  name: {ctx.k8s_name}-bundle
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
binaryData:
  bundle.tar.gz: {kube.bundle_b64}
"""


def k8s_trainjob(ctx: LaunchContext, kube: KubeContext) -> str:
    entries, optional = _pod_env(ctx)
    header = _k8s_header(
        ctx,
        kube,
        what="Kubeflow Trainer (v2) TrainJob",
        apply="kubectl apply --server-side -f k8s.yaml   (Kubeflow Trainer v2.3+, torch-distributed runtime)",
        extra=(
            "# The runtime sets PET_NNODES / PET_MASTER_ADDR / PET_MASTER_PORT, which launch.sh reads.\n"
            "# Volumes, the grace period and IPC_LOCK reach the pods through runtimePatches (Trainer v2.2+;\n"
            "# terminationGracePeriodSeconds v2.3+). Trainer v2.1 called it podTemplateOverrides, v2.0\n"
            "# podSpecOverrides: on those, use k8s-pytorchjob.yaml or move the volumes there.\n"
        ),
    )
    return f"""{header}{_pvc_yaml(ctx, kube)}---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {ctx.k8s_name}
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    image: {yaml_str(ctx.image)}
    numNodes: {ctx.num_nodes}
    command: ["bash", "-c", {yaml_str(_UNPACK)}]
    args: ["launch"]
    resourcesPerNode:
{_resources_yaml(ctx, kube, indent=6)}    env:
{_env_yaml(entries, 6, optional)}  runtimePatches:
    - manager: fsdp-planner
      trainingRuntimeSpec:
        template:
          spec:
            replicatedJobs:
              - name: node
                template:
                  spec:
                    template:
                      spec:
                        terminationGracePeriodSeconds: {environment.TERMINATION_GRACE_S}
                        volumes:
{_volumes_yaml(ctx, kube, 26)}                        containers:
                          - name: node
{_security_yaml(ctx, kube, 28)}                            volumeMounts:
{_mounts_yaml(30)}{_configmap_yaml(ctx, kube)}"""


def k8s_pytorchjob(ctx: LaunchContext, kube: KubeContext) -> str:
    entries, optional = _pod_env(ctx)
    # The training operator sets MASTER_ADDR / MASTER_PORT; NNODES comes from the plan (its
    # WORLD_SIZE / RANK count pods or processes depending on the operator version: not used).
    header = _k8s_header(
        ctx,
        kube,
        what="Kubeflow Training Operator (v1) PyTorchJob",
        apply="kubectl apply --server-side -f k8s-pytorchjob.yaml   (clusters without Trainer v2)",
        extra="",
    )

    def replica(kind: str, count: int) -> str:
        return f"""    {kind}:
      replicas: {count}
      restartPolicy: OnFailure
      template:
        spec:
          terminationGracePeriodSeconds: {environment.TERMINATION_GRACE_S}
          volumes:
{_volumes_yaml(ctx, kube, 12)}          containers:
            - name: pytorch
              image: {yaml_str(ctx.image)}
              command: ["bash", "-c", {yaml_str(_UNPACK)}]
              args: ["launch"]
              resources:
{_resources_yaml(ctx, kube, indent=16)}{_security_yaml(ctx, kube, 14)}              env:
{_env_yaml(entries, 16, optional)}              volumeMounts:
{_mounts_yaml(16)}"""

    workers = replica("Worker", ctx.num_nodes - 1) if ctx.num_nodes > 1 else ""
    return f"""{header}{_pvc_yaml(ctx, kube)}---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {ctx.k8s_name}
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
spec:
  runPolicy:
    cleanPodPolicy: None
  pytorchReplicaSpecs:
{replica("Master", 1)}{workers}{_configmap_yaml(ctx, kube)}"""


def readme(
    ctx: LaunchContext, *, targets: list[str], prediction: str, kube: KubeContext | None = None
) -> str:
    """The bundle's README.md: how to run each of its targets, its mesh, the cluster environment."""
    return render_template(
        "README.md.j2",
        ctx=ctx,
        targets=targets,
        prediction=prediction,
        kube=kube,
        env_table=environment.readme_table(),
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
        "data_parallel_only": mesh is not None and mesh.tp == 1 and mesh.pp == 1 and mesh.cp == 1,
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
    "LaunchContext",
    "comment",
    "k8s_pytorchjob",
    "k8s_trainjob",
    "launch_sh",
    "readme",
    "slurm_sbatch",
]
