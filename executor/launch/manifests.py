"""The Kubernetes objects of a launch bundle, as data: the checkpoint PersistentVolumeClaim, the job
(Kubeflow Trainer v2 TrainJob, or Training Operator v1 PyTorchJob) and the ConfigMap that carries the
bundle. render.py dumps them with a YAML library between the comments of templates/k8s.yaml.j2; no
manifest text is assembled by hand, so every value is quoted by the dumper, whatever it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from executor.launch import environment
from executor.launch.scheduling import QUEUE_LABEL, Scheduling
from executor.launch.templating import render_template

if TYPE_CHECKING:
    from executor.launch.render import LaunchContext

Document = dict[str, Any]

BUNDLE_MOUNT = "/etc/fsdp-bundle"
"""Where the ConfigMap (one file, bundle.tar.gz) is mounted, read-only."""
WORK_DIR = "/tmp/fsdp-bundle"
"""Where each pod unpacks it (writable: metrics files and the like land beside launch.sh)."""
CHECKPOINT_MOUNT = "/checkpoints"
"""Where the checkpoint PersistentVolumeClaim is mounted: CHECKPOINT_DIR in the pods."""
RDMA_EXAMPLE = "rdma/rdma_shared_device_a"
"""The RDMA resource the manifests' commented-out example names."""
DOMAIN_LABEL = "nvidia.com/gpu.clique"
"""The node label naming a node's NVLink domain (NVIDIA GPU Feature Discovery's on multi-node NVLink
systems such as GB200 NVL72): the topology level a queued job's pods are kept together by."""
SLICE_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
"""Kueue's topology-aware scheduling: the pods of a pod set in slices of this many, each slice inside
one domain of that topology level."""


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
    """Extended resource of the RDMA device plugin (None: the manifests show it commented out)."""
    rdma_count: int = 1
    scheduling: Scheduling = field(default_factory=Scheduling)
    """Kueue queue, node selector, tolerations, priority class, GPU resource name (scheduling.py)."""


def unpack_command() -> str:
    """The bash command every pod runs: unpack the ConfigMap's archive into a writable directory and
    run launch.sh there (the container's args follow as "$@")."""
    return render_template("parts/unpack.sh.j2", work_dir=WORK_DIR, bundle_mount=BUNDLE_MOUNT).strip()


def _metadata(ctx: LaunchContext, name: str) -> Document:
    return {"name": name, "labels": {"fsdp-planner/plan": ctx.short_hash}}


def _job_metadata(ctx: LaunchContext, kube: KubeContext) -> Document:
    """The job's metadata: with a Kueue queue, the label that puts the job in it."""
    metadata = _metadata(ctx, ctx.k8s_name)
    if kube.scheduling.queue:
        metadata["labels"][QUEUE_LABEL] = kube.scheduling.queue
    return metadata


def suspended(kube: KubeContext) -> Document:
    """`suspend: true` for a queued job: it waits until Kueue admits it (Kueue's webhook sets it too;
    written out, a job meant for a queue never starts its pods outside the queue's quota)."""
    return {"suspend": True} if kube.scheduling.queue else {}


def access_mode(ctx: LaunchContext) -> str:
    """Every node's pod writes its shards into the same checkpoint: several nodes need a shared claim."""
    return "ReadWriteMany" if ctx.num_nodes > 1 else "ReadWriteOnce"


def checkpoint_claim(ctx: LaunchContext, kube: KubeContext) -> Document:
    """The PersistentVolumeClaim the checkpoints live on (the cluster's default storage class)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(ctx, f"{ctx.k8s_name}-checkpoints"),
        "spec": {
            "accessModes": [access_mode(ctx)],
            "resources": {"requests": {"storage": f"{kube.checkpoint_gib}Gi"}},
        },
    }


def bundle_config_map(ctx: LaunchContext, kube: KubeContext) -> Document:
    """The ConfigMap carrying the bundle archive (launch.sh, plan.json, the runtime)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ctx, f"{ctx.k8s_name}-bundle"),
        "binaryData": {"bundle.tar.gz": kube.bundle_b64},
    }


def pod_env(ctx: LaunchContext) -> list[Document]:
    """The container's env: the plan's world and checkpoint directory, then the cluster environment's
    fixed defaults (environment.k8s_env; the variables left unset are listed in a comment instead)."""
    given, _ = environment.k8s_env(ctx.stack.vendor)
    entries = [
        ("NNODES", str(ctx.num_nodes)),
        ("NPROC_PER_NODE", str(ctx.gpus_per_node)),
        ("RDZV_ID", ctx.k8s_name),
        ("CHECKPOINT_DIR", CHECKPOINT_MOUNT),
        *given,
    ]
    return [{"name": name, "value": value} for name, value in entries]


def resources(ctx: LaunchContext, kube: KubeContext) -> Document:
    """A node's GPUs (or, for a CPU plan, its cores), and the RDMA adapters when asked for."""
    if ctx.uses_gpus:
        requested: Document = {"limits": {kube.scheduling.gpu_resource: ctx.gpus_per_node}}
    else:
        requested = {"requests": {"cpu": ctx.gpus_per_node}}
    if kube.rdma_resource:
        requested.setdefault("limits", {})[kube.rdma_resource] = kube.rdma_count
    return requested


def security_context(kube: KubeContext) -> Document:
    """IPC_LOCK lets NCCL pin memory for the RDMA adapters ({} without them)."""
    return {"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}} if kube.rdma_resource else {}


def volumes(ctx: LaunchContext, kube: KubeContext) -> list[Document]:
    """The bundle, /dev/shm in memory (NCCL and torch share memory between a node's processes there),
    and the checkpoint claim."""
    return [
        {"name": "bundle", "configMap": {"name": f"{ctx.k8s_name}-bundle"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{kube.shm_gib}Gi"}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{ctx.k8s_name}-checkpoints"}},
    ]


def volume_mounts() -> list[Document]:
    return [
        {"name": "bundle", "mountPath": BUNDLE_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT},
    ]


def pod_metadata(ctx: LaunchContext, kube: KubeContext) -> Document:
    """For a queued TrainJob whose scale-up domains span nodes, the pod template's annotations that have
    Kueue place its pods a domain at a time (one pod per node: slices of `domain_nodes` pods, each on
    one NVLink domain), as the plan lays its ranks out; {} otherwise. Only the TrainJob's one pod set
    of every node can be sliced so: a PyTorchJob's Master and Workers are pod sets of their own."""
    if not kube.scheduling.queue or ctx.domain_nodes <= 1:
        return {}
    return {"metadata": {"annotations": {SLICE_TOPOLOGY: DOMAIN_LABEL, SLICE_SIZE: str(ctx.domain_nodes)}}}


def _pod_spec(ctx: LaunchContext, kube: KubeContext, container: Document) -> Document:
    return {
        "terminationGracePeriodSeconds": environment.TERMINATION_GRACE_S,
        **kube.scheduling.pod_fields(),
        "volumes": volumes(ctx, kube),
        "containers": [container],
    }


def train_job(ctx: LaunchContext, kube: KubeContext) -> Document:
    """The Kubeflow Trainer v2 TrainJob on the torch-distributed runtime: the trainer's container, and
    a runtime patch for what the trainer section cannot say (volumes, grace period, IPC_LOCK)."""
    node = {"name": "node", **security_context(kube), "volumeMounts": volume_mounts()}
    patch = {"spec": {"template": {**pod_metadata(ctx, kube), "spec": _pod_spec(ctx, kube, node)}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _job_metadata(ctx, kube),
        "spec": {
            **suspended(kube),
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "image": ctx.image,
                "numNodes": ctx.num_nodes,
                "command": ["bash", "-c", unpack_command()],
                "args": ["launch"],
                "resourcesPerNode": resources(ctx, kube),
                "env": pod_env(ctx),
            },
            "runtimePatches": [
                {
                    "manager": "fsdp-planner",
                    "trainingRuntimeSpec": {
                        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": patch}]}}
                    },
                }
            ],
        },
    }


def pytorch_job(ctx: LaunchContext, kube: KubeContext) -> Document:
    """The Training Operator v1 PyTorchJob: a Master pod, and a Worker for every other node. The
    operator sets MASTER_ADDR / MASTER_PORT; NNODES comes from the plan (its WORLD_SIZE / RANK count
    pods or processes depending on the operator version: not used)."""

    def replica(count: int) -> Document:
        container = {
            "name": "pytorch",
            "image": ctx.image,
            "command": ["bash", "-c", unpack_command()],
            "args": ["launch"],
            "resources": resources(ctx, kube),
            **security_context(kube),
            "env": pod_env(ctx),
            "volumeMounts": volume_mounts(),
        }
        pod = {"spec": _pod_spec(ctx, kube, container)}
        return {"replicas": count, "restartPolicy": "OnFailure", "template": pod}

    replicas = {"Master": replica(1)}
    if ctx.num_nodes > 1:
        replicas["Worker"] = replica(ctx.num_nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _job_metadata(ctx, kube),
        "spec": {"runPolicy": {"cleanPodPolicy": "None", **suspended(kube)}, "pytorchReplicaSpecs": replicas},
    }
