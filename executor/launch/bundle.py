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
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from executor.launch import render
from executor.launch.quoting import comment, dns_label, hex_id, image_ref, positive_int, slug
from planner.formatting import duration
from planner.plan import Plan

Target = Literal["torchrun", "slurm", "k8s", "all"]
Format = Literal["tar.gz", "zip"]
TARGETS: tuple[str, ...] = ("torchrun", "slurm", "k8s", "all")
FORMATS: tuple[str, ...] = ("tar.gz", "zip")
DEFAULT_IMAGE = "pytorch/pytorch:latest"
"""Container image in the Kubernetes manifests unless one is given (edit it: pin a torch version)."""

_RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
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


def archive_filename(plan: Plan, *, fmt: Format = "tar.gz") -> str:
    _check_choice(fmt, FORMATS, "format")
    return f"{bundle_name(plan)}.{fmt}"


def context(plan: Plan, *, image: str = DEFAULT_IMAGE) -> render.LaunchContext:
    """Validated and quoted values the templates use."""
    full_hash = hex_id(plan.plan_hash)
    cluster = plan.cluster
    nodes = positive_int(cluster.num_nodes, "cluster.num_nodes")
    gpus = positive_int(cluster.gpus_per_node, "cluster.gpus_per_node")
    title = comment(f"{plan.model.name} on {nodes}x{gpus}x{cluster.gpu}", limit=100)
    mesh = plan.config.mesh
    return render.LaunchContext(
        title=title,
        plan_hash=full_hash,
        short_hash=full_hash[:12],
        job_name=slug(f"fsdp-{plan.model.name}", limit=60),
        k8s_name=dns_label(f"fsdp-{plan.model.name}", suffix=full_hash[:8]),
        num_nodes=nodes,
        gpus_per_node=gpus,
        gpu=comment(cluster.gpu, limit=40),
        uses_gpus=cluster.gpu.lower() != "cpu",
        image=image_ref(image),
        label=comment(plan.config.label(), limit=100),
        mesh=render.Mesh(
            dp_replicate=positive_int(mesh.dp_replicate, "config.mesh.dp_replicate"),
            dp_shard=positive_int(mesh.dp_shard, "config.mesh.dp_shard"),
            tp=positive_int(mesh.tp, "config.mesh.tp"),
        ),
    )


def runtime_files(packages: tuple[str, ...] = ("runtime",)) -> list[BundleFile]:
    """The source of executor packages (stdlib + torch only), as a bundle carries them."""
    files = [BundleFile("executor/__init__.py", _EXECUTOR_INIT.encode())]
    root = _RUNTIME_DIR.parent
    for package in packages:
        for source in sorted((root / package).rglob("*.py")):
            if "__pycache__" in source.parts:
                continue
            files.append(BundleFile(source.relative_to(root.parent).as_posix(), source.read_bytes()))
    return files


def bundle_files(plan: Plan, *, target: Target = "all", image: str = DEFAULT_IMAGE) -> list[BundleFile]:
    """Every file of the bundle for `target`, in a stable order."""
    _check_choice(target, TARGETS, "target")
    targets = ["torchrun", "slurm", "k8s"] if target == "all" else [target]
    ctx = context(plan, image=image)
    core = [
        BundleFile("plan.json", (plan.model_dump_json(indent=1) + "\n").encode()),
        BundleFile("launch.sh", render.launch_sh(ctx).encode(), executable=True),
        *runtime_files(),
    ]
    files = list(core)
    if "slurm" in targets:
        files.append(BundleFile("slurm.sbatch", render.slurm_sbatch(ctx).encode(), executable=True))
    if "k8s" in targets:
        # The manifests carry launch.sh + plan + runtime themselves (see render._UNPACK).
        payload = base64.b64encode(_tar_gz(core, root=None)).decode("ascii")
        files.append(BundleFile("k8s.yaml", render.k8s_trainjob(ctx, payload_b64=payload).encode()))
        files.append(
            BundleFile("k8s-pytorchjob.yaml", render.k8s_pytorchjob(ctx, payload_b64=payload).encode())
        )
    pred = plan.prediction
    prediction = (
        f"Predicted: {duration(pred.step_time_s)}/step, {pred.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
        f"MFU {100 * pred.mfu:.1f}%, peak {pred.peak_memory_gib:.1f} GiB per GPU."
    )
    files.append(BundleFile("README.md", render.readme(ctx, targets=targets, prediction=prediction).encode()))
    return files


def build_bundle(
    plan: Plan, *, target: Target = "all", fmt: Format = "tar.gz", image: str = DEFAULT_IMAGE
) -> bytes:
    """The bundle archive for `plan` (bytes of a .tar.gz or .zip)."""
    _check_choice(fmt, FORMATS, "format")
    files = bundle_files(plan, target=target, image=image)
    root = bundle_name(plan)
    return _tar_gz(files, root=root) if fmt == "tar.gz" else _zip(files, root=root)


def write_bundle(
    plan: Plan,
    out_dir: str | Path,
    *,
    target: Target = "all",
    fmt: Format = "tar.gz",
    image: str = DEFAULT_IMAGE,
    extract: bool = True,
) -> Path:
    """Write the archive into `out_dir` (and, with `extract`, the unpacked bundle directory beside
    it); returns the archive's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / archive_filename(plan, fmt=fmt)
    archive.write_bytes(build_bundle(plan, target=target, fmt=fmt, image=image))
    if extract:
        root = out / bundle_name(plan)
        for f in bundle_files(plan, target=target, image=image):
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
