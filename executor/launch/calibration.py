"""Calibration bundles: the profiler for a multi-node cluster, launched like training (torchrun, SLURM).

`fsdp-planner calibrate` profiles the node it runs on; a cluster of several nodes gets this bundle
instead: `calibrate.sh` on every node (or `sbatch calibrate.sbatch`) measures inter-node collectives
too, and rank 0 writes `profile.json` into the bundle directory for upload.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from executor.launch import render, vendors
from executor.launch.bundle import DEFAULT_IMAGE, BundleFile, runtime_files
from executor.launch.quoting import comment, dns_label, image_ref, positive_int, slug
from executor.launch.templating import render_template
from planner.specs import ClusterSpec, ModelSpec

_MICRO_BATCHES = re.compile(r"^[1-9][0-9]{0,4}(,[1-9][0-9]{0,4}){0,7}$")


def _entry(
    *, budget_s: float, seq_len: int, micro_batches: str, name: str | None, has_model: bool
) -> render.Entry:
    args = render_template(
        "parts/profile_args.sh.j2",
        budget=f"{budget_s:g}",
        seq_len=positive_int(seq_len, "seq_len"),
        micro_batches=micro_batches,  # checked: sizes and commas only
        has_model=has_model,
        name=name,
    )
    return render.Entry(
        script="calibrate.sh",
        module="executor.profile.run",
        args=args,
        usage="./calibrate.sh [profiler options]        e.g. ./calibrate.sh --budget-s 300",
        resumable=False,
    )


def calibration_bundle_files(
    cluster: ClusterSpec,
    *,
    model: ModelSpec | None = None,
    seq_len: int = 2048,
    micro_batches: str = "1,2",
    budget_s: float = 120.0,
    name: str | None = None,
) -> list[BundleFile]:
    """calibrate.sh, calibrate.sbatch, model.json, the runtime and profiler source, and a README."""
    if not _MICRO_BATCHES.fullmatch(micro_batches):
        raise ValueError(f"micro_batches {micro_batches!r}: write sizes separated by commas, e.g. 1,2,4")
    if not 0 < budget_s <= 24 * 3600:
        raise ValueError(f"budget_s {budget_s}: give a positive number of seconds (at most a day)")
    inputs = {
        "cluster": cluster.model_dump(mode="json"),
        "model": model.model_dump(mode="json") if model else None,
        "seq_len": seq_len,
        "micro_batches": micro_batches,
        "budget_s": budget_s,
        "name": name,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    where = f"{cluster.num_nodes}x{cluster.gpus_per_node}x{cluster.gpu}"
    ctx = render.LaunchContext(
        title=comment(f"calibration of {where}", limit=100),
        plan_hash=digest,
        short_hash=digest[:12],
        job_name=slug(f"fsdp-calibrate-{cluster.gpu}", limit=60),
        k8s_name=dns_label(f"fsdp-calibrate-{cluster.gpu}", suffix=digest[:8]),
        num_nodes=positive_int(cluster.num_nodes, "cluster.num_nodes"),
        gpus_per_node=positive_int(cluster.gpus_per_node, "cluster.gpus_per_node"),
        gpu=comment(cluster.gpu, limit=40),
        uses_gpus=not cluster.resolved_gpu().is_cpu,
        image=image_ref(DEFAULT_IMAGE),
        label="calibration",
        stack=vendors.stack_for(cluster.resolved_gpu()),
    )
    entry = _entry(
        budget_s=budget_s,
        seq_len=seq_len,
        micro_batches=micro_batches,
        name=name,
        has_model=model is not None,
    )
    files = [
        BundleFile("calibrate.sh", render.launch_sh(ctx, entry).encode(), executable=True),
        BundleFile("calibrate.sbatch", render.slurm_sbatch(ctx, entry).encode(), executable=True),
        *runtime_files(("runtime", "profile")),
    ]
    if model is not None:
        files.append(BundleFile("model.json", (model.model_dump_json(indent=1) + "\n").encode()))
    files.append(BundleFile("README.md", _readme(where, cluster, budget_s).encode()))
    return files


def calibration_bundle_name(cluster: ClusterSpec) -> str:
    return slug(f"fsdp-calibrate-{cluster.num_nodes}x{cluster.gpus_per_node}x{cluster.gpu}", limit=60)


def write_calibration_bundle(cluster: ClusterSpec, out_dir: str | Path, **options: object) -> Path:
    """Unpack the calibration bundle into `out_dir`; returns its directory."""
    root = Path(out_dir) / calibration_bundle_name(cluster)
    for f in calibration_bundle_files(cluster, **options):  # type: ignore[arg-type]
        dest = root / f.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.data)
        dest.chmod(0o755 if f.executable else 0o644)
    return root


def _readme(where: str, cluster: ClusterSpec, budget_s: float) -> str:
    return render_template(
        "calibration_README.md.j2",
        where=comment(where, limit=100),
        budget=f"{budget_s:g}",
        num_nodes=cluster.num_nodes,
    )
