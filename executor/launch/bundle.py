"""Build a launch bundle (tar.gz or zip) from a Plan: the one function the CLI and the API share.

`build_bundle(plan, target=..., fmt=...)` returns the archive bytes; it is pure (no torch, no
network, no writes) and deterministic: the same plan and options give byte-identical archives,
so the API can cache and ETag them. Everything lives under one top-level directory
`fsdp-<model>-<hash12>/`, which is what `cd bundle && ./launch.sh` expects.
"""

from __future__ import annotations

import base64
import gzip
import io
import math
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import contract
from contract.parallel_config import PIPELINE_SCHEDULES, Float8Recipe, PipelineConfig
from executor.launch import render, scheduling, skypilot, vendors
from executor.launch.quoting import (
    VERSION3,
    UnsafeValueError,
    comment,
    dns_label,
    hex_id,
    image_ref,
    positive_int,
    resource_name,
    slug,
    version,
)
from executor.launch.templating import render_template
from planner.calibration import CalibrationProfile
from planner.formatting import between, duration
from planner.plan import Plan

Target = Literal["torchrun", "slurm", "k8s", "skypilot", "all", "torchtitan"]
Format = Literal["tar.gz", "zip"]
TARGETS: tuple[str, ...] = ("torchrun", "slurm", "k8s", "skypilot", "all", "torchtitan")
"""`torchtitan` is a bundle of its own (executor/launch/torchtitan.py): the plan as a torchtitan job, which
`all` does not include since it runs another trainer."""
FORMATS: tuple[str, ...] = ("tar.gz", "zip")
DEFAULT_TORCH_VERSION = "2.13.0"
"""The torch the runtime is built and tested with (the `executor` extra's pin), so the version a plan
is made for unless the bundle is rendered for another."""
DEFAULT_CUDA_VERSION = vendors.DEFAULT_CUDA_VERSION
"""The CUDA of PyTorch's official image for DEFAULT_TORCH_VERSION."""
DEFAULT_ROCM_VERSION = vendors.DEFAULT_ROCM_VERSION
"""The ROCm of AMD's PyTorch image that AMD plans' manifests run."""
MIN_TORCH = (2, 6)
"""The oldest torch the runtime supports (the bundle README says so too)."""
CONFIGMAP_LIMIT_BYTES = 1024 * 1024
"""Kubernetes refuses a ConfigMap whose data exceeds 1 MiB."""


def official_image(
    torch_version: str = DEFAULT_TORCH_VERSION, cuda_version: str = DEFAULT_CUDA_VERSION
) -> str:
    """PyTorch's official runtime image for a torch and CUDA version, e.g.
    `pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime` (Docker Hub's tag scheme since torch 2.3)."""
    return vendors.NVIDIA.image(torch_version=torch_version, runtime_version=cuda_version)


DEFAULT_IMAGE = official_image()
"""Container image in the Kubernetes manifests unless another torch version or image is given."""
DEFAULT_TORCHTITAN_SERIES = "0.3"
"""The torchtitan series a `torchtitan` bundle is written for unless asked (executor/launch/torchtitan.py
holds the series and their releases); other series' archives carry theirs in their names."""


class BundleTooLargeError(ValueError):
    """The bundle archive does not fit in a Kubernetes ConfigMap (1 MiB)."""


_RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
_CONTRACT_DIR = Path(contract.__file__).resolve().parent
_EXECUTOR_INIT = '"""fsdp-planner executor (bundle copy: the packages the bundle runs)."""\n'
_MTIME = 315532800  # 1980-01-01: zip's earliest date; fixed so archives are reproducible
MEDIA_TYPES = {"tar.gz": "application/gzip", "zip": "application/zip"}


@dataclass(frozen=True, slots=True)
class BundleFile:
    """One file of a bundle."""

    path: str
    """Relative path inside the bundle directory."""
    data: bytes
    executable: bool = False


def bundle_name(plan: Plan) -> str:
    """Top-level directory (and archive stem): `fsdp-<model slug>-<hash12>`."""
    return f"fsdp-{slug(plan.model.name, limit=40)}-{hex_id(plan.plan_hash)[:12]}"


def plan_file(plan: Plan) -> BundleFile:
    """plan.json: the plan document every bundle carries (the runtime and the manifests' ConfigMap
    read it)."""
    return BundleFile("plan.json", (plan.model_dump_json(indent=1) + "\n").encode())


def archive_filename(
    plan: Plan, *, fmt: Format = "tar.gz", target: Target = "all", torchtitan_version: str | None = None
) -> str:
    """`fsdp-llama3-8b-<hash12>.tar.gz` for every target's bundle, `...-slurm.tar.gz` for one target's,
    `...-torchtitan-0.2.tar.gz` for a torchtitan bundle written for a series other than the default:
    bundles of one plan for different targets download under names of their own."""
    _check_choice(fmt, FORMATS, "format")
    suffix = "" if target == "all" else f"-{target}"
    if target == "torchtitan" and torchtitan_version not in (None, DEFAULT_TORCHTITAN_SERIES):
        suffix += f"-{torchtitan_version}"
    return f"{bundle_name(plan)}{suffix}.{fmt}"


def context(plan: Plan, *, image: str = DEFAULT_IMAGE) -> render.LaunchContext:
    """Validated and quoted values the templates use."""
    full_hash = hex_id(plan.plan_hash)
    cluster = plan.cluster
    gpu = cluster.resolved_gpu()
    nodes = positive_int(cluster.num_nodes, "cluster.num_nodes")
    gpus = positive_int(cluster.gpus_per_node, "cluster.gpus_per_node")
    title = comment(f"{plan.model.name} on {nodes}x{gpus}x{cluster.gpu}", limit=100)
    return render.LaunchContext(
        title=title,
        plan_hash=full_hash,
        short_hash=full_hash[:12],
        job_name=slug(f"fsdp-{plan.model.name}", limit=60),
        k8s_name=dns_label(f"fsdp-{plan.model.name}", suffix=full_hash[:8]),
        num_nodes=nodes,
        gpus_per_node=gpus,
        gpu=comment(cluster.gpu, limit=40),
        uses_gpus=not gpu.is_cpu,
        stack=vendors.stack_for(gpu),
        domain_nodes=domain_nodes(plan),
        domain_gpus=cluster.scaleup_gpus if cluster.scaleup_gpus > gpus else 0,
        image=image_ref(image),
        label=comment(plan.config.label(), limit=100),
        mesh=plan.config.mesh,  # a contract.mesh.Mesh: its degrees are checked whole numbers >= 1
        float8=_float8(plan.config.float8),
        async_tp=plan.config.async_tp is True,
        pipeline=_pipeline(plan.config.pipeline),
        pure_bf16=plan.training.state_dtype == "bfloat16",
    )


def domain_nodes(plan: Plan) -> int:
    """Nodes per scale-up domain where a domain spans nodes and whole domains make up the job (the job
    smaller than one domain: the job's nodes); else 1. What the bundles ask the scheduler to keep together."""
    cluster = plan.cluster
    per_domain = cluster.scaleup_gpus // cluster.gpus_per_node
    if per_domain <= 1:
        return 1
    nodes = min(per_domain, cluster.num_nodes)
    return nodes if cluster.num_nodes % nodes == 0 else 1


def _pipeline(pipeline: PipelineConfig | None) -> PipelineConfig | None:
    """The plan's pipeline, its schedule one of the contract's (it lands in shell comments)."""
    if pipeline is not None:
        _check_choice(pipeline.schedule, PIPELINE_SCHEDULES, "config.pipeline.schedule")
    return pipeline


def _float8(recipe: str) -> str:
    """The plan's Float8 recipe, one of the contract's (it lands in shell text)."""
    _check_choice(recipe, get_args(Float8Recipe), "config.float8")
    return recipe


def runtime_files(packages: tuple[str, ...] = ("runtime",)) -> list[BundleFile]:
    """The source of executor packages (stdlib + torch only) and of the contract they read (stdlib
    only), as a bundle carries them: each at its import path."""
    files = [BundleFile("executor/__init__.py", _EXECUTOR_INIT.encode())]
    executor = _RUNTIME_DIR.parent
    sources = [(executor / package, executor.parent) for package in packages]
    for directory, import_root in (*sources, (_CONTRACT_DIR, _CONTRACT_DIR.parent)):
        for source in sorted(directory.rglob("*.py")):
            if "__pycache__" not in source.parts:
                files.append(BundleFile(source.relative_to(import_root).as_posix(), source.read_bytes()))
    return files


def torch_image(
    torch_version: str = DEFAULT_TORCH_VERSION,
    cuda_version: str = DEFAULT_CUDA_VERSION,
    image: str | None = None,
    *,
    stack: vendors.Stack = vendors.NVIDIA,
    rocm_version: str = DEFAULT_ROCM_VERSION,
) -> str:
    """The manifests' image: `image` when given, else the stack's PyTorch image for the versions
    (PyTorch's official CUDA image, or AMD's ROCm one)."""
    version(torch_version, VERSION3, field="torch_version", example=DEFAULT_TORCH_VERSION)
    major, minor = (int(part) for part in torch_version.split(".")[:2])
    if (major, minor) < MIN_TORCH:
        raise UnsafeValueError(
            f"torch_version {torch_version!r}: the runtime needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}",
            field="torch_version",
        )
    # Both runtime versions are checked whichever the plan's stack uses: a bad option is refused as such.
    official_image(torch_version, cuda_version)
    vendors.AMD.image(torch_version=torch_version, runtime_version=rocm_version)
    if image is not None:
        return image_ref(image)
    runtime_version = rocm_version if stack is vendors.AMD else cuda_version
    return stack.image(torch_version=torch_version, runtime_version=runtime_version)


def checkpoint_gib(plan: Plan) -> int:
    """Checkpoint volume size: fp32 parameters + optimizer states (AdamW 2, SGD 1 per parameter), for
    the two checkpoints the trainer keeps plus the one it writes before deleting the oldest, with 25%
    to spare; at least 10 GiB."""
    states = 2 if plan.training.optimizer == "adamw" else 1
    one = plan.model.num_params * 4 * (1 + states)
    return max(10, math.ceil(one * 3 * 1.25 / 2**30))


@dataclass(frozen=True, slots=True, kw_only=True)
class PodOptions:
    """The Kubernetes options of a bundle as given (the CLI's options, the API's query parameters):
    the manifests' image, the pods' scheduling and RDMA. pod_placement checks them."""

    image: str | None = None
    """The manifests' image; None: the plan's GPU vendor's PyTorch image for the versions below."""
    torch_version: str = DEFAULT_TORCH_VERSION
    """The torch the plan runs with (the image's, and the SkyPilot task's requirement)."""
    cuda_version: str = DEFAULT_CUDA_VERSION
    """The CUDA of PyTorch's official image (NVIDIA GPUs)."""
    rocm_version: str = DEFAULT_ROCM_VERSION
    """The ROCm of AMD's PyTorch image (AMD GPUs)."""
    rdma_resource: str | None = None
    """The RDMA device plugin's extended resource (`domain/name`) every pod requests; None: none."""
    rdma_count: int = 1
    """RDMA resources per pod (1 to 64)."""
    queue: str | None = None
    """Kueue LocalQueue of the job (scheduling.py)."""
    node_selector: Sequence[str] = ()
    """`key=value` labels a pod's node must carry."""
    tolerations: Sequence[str] = ()
    """Taints the pods tolerate: `key[=value][:Effect]`."""
    priority_class: str | None = None
    """PriorityClass of the pods."""
    gpu_resource: str | None = None
    """The GPUs' resource name; None: the vendor's (nvidia.com/gpu or amd.com/gpu)."""


def kube_context(
    plan: Plan,
    core: list[BundleFile],
    *,
    torch_version: str = DEFAULT_TORCH_VERSION,
    rdma_resource: str | None = None,
    rdma_count: int = 1,
    pods: scheduling.Scheduling | None = None,
) -> render.KubeContext:
    """The manifests' inputs; refuses a bundle that a ConfigMap cannot carry."""
    archive = _tar_gz(core, root=None)
    if len(archive) > CONFIGMAP_LIMIT_BYTES:
        raise BundleTooLargeError(
            f"the bundle archive is {len(archive) / 2**20:.2f} MiB, more than a Kubernetes ConfigMap holds "
            f"(1 MiB); plan.json is {len(next(f.data for f in core if f.path == 'plan.json')):,} bytes. "
            "Use the torchrun or slurm target, or bake the bundle into your image (--image) and drop the "
            "ConfigMap from the manifests"
        )
    if rdma_resource is not None:
        resource_name(rdma_resource, field="rdma_resource")  # nvidia.com/gpu refused: the GPUs
        if rdma_resource in scheduling.GPU_RESOURCES:
            raise UnsafeValueError(f"rdma_resource: {rdma_resource} is the GPUs, requested already",
                                   field="rdma_resource")
    if isinstance(rdma_count, bool) or not isinstance(rdma_count, int) or not 1 <= rdma_count <= 64:
        raise UnsafeValueError(f"rdma_count {rdma_count!r}: give 1 to 64", field="rdma_count")
    return render.KubeContext(
        torch_version=torch_version,
        bundle_b64=base64.b64encode(archive).decode("ascii"),
        bundle_bytes=len(archive),
        checkpoint_gib=checkpoint_gib(plan),
        shm_gib=max(4, 2 * plan.cluster.gpus_per_node),
        rdma_resource=rdma_resource,
        rdma_count=rdma_count,
        scheduling=pods or scheduling.Scheduling(),
    )


def bundle_files(
    plan: Plan,
    *,
    target: Target = "all",
    pods: PodOptions = PodOptions(),
    calibration: CalibrationProfile | None = None,
    torchtitan_version: str = DEFAULT_TORCHTITAN_SERIES,
) -> list[BundleFile]:
    """Every file of the bundle for `target`, in a stable order.

    `pods` (PodOptions) holds the Kubernetes options: the manifests' image, the pods' scheduling and RDMA;
    `calibration` (the plan's profile) re-prices a `torchtitan` bundle, written for `torchtitan_version`
    (`0.3`: its Python config module; `0.2`: its TOML job config)."""
    _check_target(target)
    placement = pod_placement(plan, pods)
    if target == "torchtitan":
        # Imported here: the torchtitan target builds on this module's context and files.
        from executor.launch import torchtitan

        return torchtitan.bundle_files(
            plan, calibration=calibration, placement=placement, series=torchtitan_version
        )
    targets = ["torchrun", "slurm", "k8s", "skypilot"] if target == "all" else [target]
    ctx = context(plan, image=placement.image)
    core = [
        plan_file(plan),
        BundleFile("launch.sh", render.launch_sh(ctx).encode(), executable=True),
        *runtime_files(),
    ]
    files = list(core)
    if "slurm" in targets:
        files.append(BundleFile("slurm.sbatch", render.slurm_sbatch(ctx).encode(), executable=True))
    kube = None
    if "k8s" in targets:
        # The manifests carry launch.sh + plan + runtime in a ConfigMap (see manifests.unpack_command).
        kube, manifests = kubernetes_files(plan, ctx, core, placement)
        files.extend(manifests)
    sky, sky_missing = None, ""
    if "skypilot" in targets:
        try:
            sky = skypilot.SkyContext(
                accelerator=skypilot.accelerator(plan.cluster.resolved_gpu()),
                requirements=skypilot.requirements(torch_version=pods.torch_version, float8=ctx.float8),
                image=ctx.image if pods.image is not None else None,
            )
        except skypilot.NotOnSkyPilotError as exc:
            if target == "skypilot":
                raise
            sky_missing = str(exc).removeprefix("target skypilot: ")  # the bundle's other targets stand
        if sky is not None:
            requirements = "".join(f"{line}\n" for line in sky.requirements)
            files.append(BundleFile(skypilot.REQUIREMENTS_FILE, requirements.encode()))
            files.append(BundleFile(skypilot.TASK_FILE, render.skypilot_task(ctx, sky).encode()))
    prediction = _prediction(plan)
    text = render.readme(
        ctx, targets=targets, prediction=prediction, kube=kube, sky=sky, sky_missing=sky_missing
    )
    files.append(BundleFile("README.md", text.encode()))
    return files


@dataclass(frozen=True, slots=True)
class Placement:
    """The Kubernetes options of a bundle, validated: the image, the pods' scheduling and RDMA."""

    stack: vendors.Stack
    """The plan's GPU vendor's stack."""
    image: str
    """The manifests' image (the one given, else the stack's PyTorch image)."""
    given_image: bool
    """Whether the image was given (--image): then it may drive another vendor's GPUs."""
    torch_version: str
    pods: scheduling.Scheduling
    rdma_resource: str | None = None
    rdma_count: int = 1


def pod_placement(plan: Plan, pods: PodOptions = PodOptions()) -> Placement:
    """The bundle's Kubernetes options checked (PodOptions says what each is); every target's bundle
    checks them, so a bad one is refused whichever target is asked for."""
    stack = vendors.stack_for(plan.cluster.resolved_gpu())
    scheduled = scheduling.scheduling(
        queue=pods.queue, node_selector=pods.node_selector, tolerations=pods.tolerations,
        priority_class=pods.priority_class, gpu_resource=pods.gpu_resource or stack.gpu_resource,
    )
    chosen = torch_image(
        pods.torch_version, pods.cuda_version, pods.image, stack=stack, rocm_version=pods.rocm_version
    )
    return Placement(
        stack=stack, image=chosen, given_image=pods.image is not None, torch_version=pods.torch_version,
        pods=scheduled, rdma_resource=pods.rdma_resource, rdma_count=pods.rdma_count,
    )


def kubernetes_files(
    plan: Plan,
    ctx: render.LaunchContext,
    core: list[BundleFile],
    placement: Placement,
    entry: render.Entry = render.TRAIN,
) -> tuple[render.KubeContext, list[BundleFile]]:
    """k8s.yaml (TrainJob) and k8s-pytorchjob.yaml (PyTorchJob), whose pods unpack `core` from a
    ConfigMap and run its launch.sh (which starts `entry`), and the KubeContext the README describes."""
    _check_resource_image(plan, placement.stack, placement.pods.gpu_resource,
                          placement.image if placement.given_image else None)
    kube = kube_context(
        plan, core, torch_version=placement.torch_version, rdma_resource=placement.rdma_resource,
        rdma_count=placement.rdma_count, pods=placement.pods,
    )
    return kube, [
        BundleFile("k8s.yaml", render.k8s_trainjob(ctx, kube, entry).encode()),
        BundleFile("k8s-pytorchjob.yaml", render.k8s_pytorchjob(ctx, kube, entry).encode()),
    ]


def _check_resource_image(plan: Plan, stack: vendors.Stack, gpu_resource: str, image: str | None) -> None:
    """Refuse pods that get another vendor's GPUs than the plan's in the plan's vendor's image: a CUDA
    build of torch cannot drive AMD GPUs, nor a ROCm build NVIDIA ones, so such pods need their own."""
    other = vendors.stack_of_resource(gpu_resource)
    if other is stack or image is not None:
        return
    example = other.image(torch_version=DEFAULT_TORCH_VERSION, runtime_version=other.default_version)
    raise UnsafeValueError(
        f"gpu_resource {gpu_resource}: the plan is for {plan.cluster.gpu}, whose default image is "
        f"{stack.images} ({stack.runtime}); give an image (--image) with a {other.runtime} build of torch "
        f"for {gpu_resource} GPUs, e.g. {example}",
        field="image",
    )


def _check_target(target: str) -> None:
    """Refuse an unknown target (every axis a plan holds runs on each of them)."""
    _check_choice(target, TARGETS, "target")


def _prediction(plan: Plan) -> str:
    """The README's sentence on the plan's predictions, with their intervals where the plan has them."""
    pred = plan.prediction
    tokens, peak = pred.tokens_per_s_per_gpu_interval, pred.peak_memory_gib_interval
    return render_template(
        "parts/prediction.md.j2",
        pred=pred,
        step_time=duration(pred.step_time_s),
        tokens=between(tokens.low, tokens.high) if tokens else None,
        peak=between(peak.low, peak.high, decimals=1) if peak else None,
        level=f"{tokens.level:.0%}" if tokens else None,
    )


def build_bundle(plan: Plan, *, target: Target = "all", fmt: Format = "tar.gz", **options: object) -> bytes:
    """The bundle archive for `plan` (bytes of a .tar.gz or .zip); `options` as bundle_files takes them
    (pods, calibration, torchtitan_version)."""
    _check_choice(fmt, FORMATS, "format")
    files = bundle_files(plan, target=target, **options)  # type: ignore[arg-type]
    root = bundle_name(plan)
    return _tar_gz(files, root=root) if fmt == "tar.gz" else _zip(files, root=root)


def write_bundle(
    plan: Plan,
    out_dir: str | Path,
    *,
    target: Target = "all",
    fmt: Format = "tar.gz",
    extract: bool = True,
    **options: object,
) -> Path:
    """Write the archive into `out_dir` (and, with `extract`, the unpacked bundle directory beside
    it); returns the archive's path. `options` as bundle_files takes them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    series = options.get("torchtitan_version")
    name = archive_filename(plan, fmt=fmt, target=target, torchtitan_version=str(series) if series else None)
    archive = out / name
    files = bundle_files(plan, target=target, **options)  # type: ignore[arg-type]
    root_name = bundle_name(plan)
    archive.write_bytes(_tar_gz(files, root=root_name) if fmt == "tar.gz" else _zip(files, root=root_name))
    if extract:
        root = out / root_name
        for f in files:
            dest = root / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.data)
            dest.chmod(0o755 if f.executable else 0o644)
    return archive


def _check_choice(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


def _tar_gz(files: list[BundleFile], *, root: str | None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            info = tarfile.TarInfo(f"{root}/{f.path}" if root else f.path)
            info.size, info.mtime = len(f.data), _MTIME
            info.mode = 0o755 if f.executable else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(f.data))
    # mtime=0 in the gzip header too, for byte-identical archives.
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def _zip(files: list[BundleFile], *, root: str) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            info = zipfile.ZipInfo(f"{root}/{f.path}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o100755 if f.executable else 0o100644) & 0xFFFF) << 16
            zf.writestr(info, f.data)
    return raw.getvalue()
