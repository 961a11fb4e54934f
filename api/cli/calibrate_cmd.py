"""`fsdp-planner calibrate`: profile this machine with torchrun and write a CalibrationProfile.

The profiler (`executor.profile.run`) needs torch, so it runs in a torchrun subprocess; this
command only prepares its inputs, checks its output against the planner's profile schema and
shows what the fit changes relative to the catalog.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from api.cli.common import (
    EXIT_FAILED,
    SEQUENCE_TOKENS,
    ServerClient,
    WholeNumbers,
    cluster_from_options,
    decimal_number,
    fail,
    read_json_file,
    whole_number,
)
from api.cli.printing import stdout_console
from api.hints import EXECUTOR_EXTRA_INSTALL
from executor.launch.calibration import write_calibration_bundle
from executor.launch.environment import static_defaults
from executor.launch.quoting import UnsafeValueError
from executor.launch.vendors import Vendor
from planner.bounds import MAX_GPUS_PER_NODE, MAX_MICRO_BATCH, MAX_SECONDS
from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.models import resolve_model
from planner.cost.parameters import QUOTED_GROUP_SIZE, default_parameters
from planner.errors import PlanningError, describe_validation_error
from planner.formatting import duration
from planner.specs import ClusterSpec

MICRO_BATCH_SIZES = WholeNumbers(unit="sequences", low=1, high=MAX_MICRO_BATCH)
"""`--micro-batches`: the sizes whose shapes the profiler times, bounded as a plan's micro-batch is."""


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


def calibrate(
    nproc: Annotated[int, typer.Option(
        "--nproc", parser=whole_number(unit="processes", low=1, high=MAX_GPUS_PER_NODE),
        help="Local processes (GPUs) to profile.",
    )] = 1,
    model: Annotated[str | None, typer.Option(help="Catalog model whose shapes and blocks to time.")] = None,
    seq_len: Annotated[int, typer.Option(
        "--seq-len", parser=SEQUENCE_TOKENS, help="Sequence length for the block timings.",
    )] = 2048,
    micro_batches: Annotated[str, typer.Option(
        "--micro-batches", parser=MICRO_BATCH_SIZES, help="Micro-batch sizes whose shapes to time.",
    )] = "1,2",
    budget_s: Annotated[float, typer.Option(
        "--budget-s", parser=decimal_number(unit="seconds", high=MAX_SECONDS),
        help="Time allowance in seconds.",
    )] = 120.0,
    name: Annotated[str | None, typer.Option(help="Name stored in the profile.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the profile.")] = Path(
        "profile.json"
    ),
    upload: Annotated[
        str | None,
        typer.Option(help="fsdp-planner server URL to upload the profile to, e.g. http://host:8000."),
    ] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help="API key for --upload.")] = None,
    bundle: Annotated[
        Path | None,
        typer.Option(
            help="Write a calibration bundle for --cluster into this directory instead of running here."
        ),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(help="With --bundle: NODESxGPUSxGPU of the cluster to calibrate.")
    ] = None,
) -> None:
    """Measure GEMMs, collectives and the model's blocks here, within a time budget.

    For several nodes, `--bundle DIR --cluster 4x8xH100` writes a bundle to run on the cluster.
    """
    if bundle is not None:
        write_bundle(
            bundle,
            cluster,
            model=model,
            seq_len=seq_len,
            micro_batches=micro_batches,
            budget_s=budget_s,
            name=name,
        )
        return
    if importlib.util.find_spec("torch") is None:
        raise fail(
            f"calibration runs torch: install the executor extra (in the checkout: {EXECUTOR_EXTRA_INSTALL})"
        )
    if nproc < 1 or budget_s <= 0:
        raise fail("--nproc must be at least 1 and --budget-s positive")
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "executor.profile.run",
            "-o",
            str(output.resolve()),
            "--budget-s",
            str(budget_s),
            "--seq-len",
            str(seq_len),
            "--micro-batches",
            micro_batches,
        ]
        if name:
            command += ["--name", name]
        if model is not None:
            try:
                spec = resolve_model(model)
            except PlanningError as exc:
                raise fail(exc.message) from None
            model_file = Path(tmp) / "model.json"
            model_file.write_text(spec.model_dump_json())
            command += ["--model-json", str(model_file)]
        # One thread per rank: ranks share the machine's cores, and oversubscription distorts timings.
        # The launchers' environment (this torch build's vendor's: a ROCm build reads
        # PYTORCH_HIP_ALLOC_CONF) under the user's: the allocator's reserve is measured as plans run (the
        # profile records the allocator it ran under).
        env = {"OMP_NUM_THREADS": "1", **static_defaults(local_vendor()), **os.environ}
        result = subprocess.run(command, env=env, check=False)
    if result.returncode != 0:
        raise fail(f"the profiler exited with status {result.returncode}; its output is above", EXIT_FAILED)
    try:
        profile = CalibrationProfile.model_validate(read_json_file(output, "profile"))
    except ValidationError as exc:
        raise fail(describe_validation_error(exc, prefix="profile"), EXIT_FAILED) from None
    show_fit(profile, stdout_console())
    stdout_console().print(
        f"Profile written to {output}; plan with it: fsdp-planner plan ... --calibration {output}"
    )
    if upload is not None:
        stored = ServerClient(upload, api_key).post("/calibrations", profile.model_dump(mode="json"))
        stdout_console().print(
            f'Uploaded as calibration {stored["id"]}: POST plans with "calibration_id": {stored["id"]}'
        )


def local_vendor() -> Vendor:
    """The GPU vendor this machine's torch is built for: `amd` for a ROCm (HIP) build, else `nvidia`
    (whose environment a CPU run takes too). Imports torch: only when a calibration runs here."""
    from executor.profile.device import is_rocm

    return "amd" if is_rocm() else "nvidia"


def write_bundle(
    out: Path,
    cluster: str | None,
    *,
    model: str | None,
    seq_len: int,
    micro_batches: str,
    budget_s: float,
    name: str | None,
) -> None:
    """The calibration bundle (calibrate.sh over torchrun, calibrate.sbatch) for a whole cluster."""
    if cluster is None:
        raise fail("--bundle needs --cluster NODESxGPUSxGPU (the cluster the bundle will run on)")
    try:
        spec = cluster_from_options(cluster=cluster)
        model_spec = resolve_model(model) if model is not None else None
        directory = write_calibration_bundle(
            spec,
            out,
            model=model_spec,
            seq_len=seq_len,
            micro_batches=micro_batches,
            budget_s=budget_s,
            name=name,
        )
    except PlanningError as exc:
        raise fail(exc.message) from None
    except (ValueError, UnsafeValueError) as exc:
        raise fail(str(exc)) from None
    stdout_console().print(
        f"wrote {directory}\n  on the cluster: cd {directory.name} && sbatch calibrate.sbatch "
        f"(or NNODES={spec.num_nodes} MASTER_ADDR=<node 0> ./calibrate.sh on every node); then upload "
        "profile.json (POST /api/v1/calibrations)",
        highlight=False,
        soft_wrap=True,
    )


def show_fit(profile: CalibrationProfile, console: Console) -> None:
    """Catalog defaults beside the fitted values, so a person sees what the measurements changed."""
    gpu = profile.catalog_gpu()
    if gpu is None:
        console.print(
            f"[yellow]neither gpu {profile.gpu!r} nor device {profile.fingerprint.device_name!r} is in the "
            "GPU catalog: set the profile's `gpu` to compare with catalog defaults[/]"
        )
        return
    precision = "fp32" if gpu.is_cpu else "bf16"
    cluster = ClusterSpec(
        num_nodes=profile.fingerprint.num_nodes, gpus_per_node=profile.fingerprint.gpus_per_node, gpu=gpu.name
    )
    base = default_parameters(gpu, cluster, precision)
    fitted = fit_parameters(profile, base=base, precision=precision)
    table = Table(
        title=f"Calibration of {profile.fingerprint.device_name} x{profile.fingerprint.device_count}",
        title_justify="left",
    )
    for column in ("parameter", "catalog", "measured"):
        table.add_column(column, justify="left" if column == "parameter" else "right")
    rows = [
        ("matmul efficiency", f"{base.matmul_efficiency:.2f}", f"{fitted.matmul_efficiency:.2f}"),
        (
            "matmul overhead",
            duration(base.matmul_overhead_s),
            duration(fitted.matmul_overhead_s),
        ),
        (
            "memory bandwidth",
            f"{base.memory_bandwidth / 1e9:.0f} GB/s",
            f"{fitted.memory_bandwidth / 1e9:.0f} GB/s",
        ),
        ("compute scale", f"{base.compute_scale:.2f}", f"{fitted.compute_scale:.2f}"),
        (
            "compiled compute scale",
            f"{base.compiled_compute_scale:.2f}",
            f"{fitted.compiled_compute_scale:.2f}",
        ),
        (
            "optimizer step",
            f"{base.optimizer_bytes_per_param:.0f} B/param",
            f"{fitted.optimizer_bytes_per_param:.0f} B/param + {duration(fitted.optimizer_overhead_s)}",
        ),
        (
            "overhead per micro-batch",
            duration(base.micro_batch_overhead_s),
            duration(fitted.micro_batch_overhead_s),
        ),
        (
            "sharding overhead per micro-batch",
            duration(base.sharding_overhead_s),
            duration(fitted.sharding_overhead_s),
        ),
        (
            "compiled overhead per micro-batch",
            duration(base.compiled_overhead_s),
            duration(fitted.compiled_overhead_s),
        ),
        ("overlap contention", f"{base.overlap_contention:.2f}", f"{fitted.overlap_contention:.2f}"),
        # A mixture of experts' routed experts: their grouped GEMMs' share of the dense GEMM rate.
        *(
            [(
                "grouped GEMM efficiency (routed experts)",
                f"{base.grouped_gemm_efficiency:.2f}",
                f"{fitted.grouped_gemm_efficiency:.2f}",
            )]
            if profile.grouped_gemm is not None
            else []
        ),
        (
            "activation memory (eager / compiled)",
            f"{base.activation_memory_scale:.2f} / {base.compiled_activation_memory_scale:.2f}",
            f"{fitted.activation_memory_scale:.2f} / {fitted.compiled_activation_memory_scale:.2f}",
        ),
        ("allocator reserve", f"{base.allocator_reserve:.1%}", f"{fitted.allocator_reserve:.1%}"),
        ("usable memory", f"{base.usable_memory_gib:.1f} GiB", f"{fitted.usable_memory_gib:.1f} GiB"),
        ("memory margin", f"{base.memory_margin:.0%}", f"{fitted.memory_margin:.0%}"),
    ]
    for link in ("intra", "inter"):
        b, f = base.links[link], fitted.links[link]
        rows.append(
            (f"{link}-node bandwidth", f"{b.bandwidth / 1e9:.1f} GB/s", f"{f.bandwidth / 1e9:.1f} GB/s")
        )
        rows.append(
            (
                f"{link}-node latency at {QUOTED_GROUP_SIZE} ranks",
                duration(b.latency(QUOTED_GROUP_SIZE)),
                duration(f.latency(QUOTED_GROUP_SIZE)),
            )
        )
        rows.append(
            (
                f"{link}-node latency per doubling",
                duration(b.latency_per_log2_s),
                duration(f.latency_per_log2_s),
            )
        )
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if profile.grouped_gemm is not None and not profile.grouped_gemm.samples:
        reason = escape(profile.grouped_gemm.not_measured or "no reason recorded")
        console.print(
            f"[yellow]grouped GEMM not measured ({reason}): the routed experts keep the catalog's "
            "efficiency[/]",
            highlight=False,
        )
