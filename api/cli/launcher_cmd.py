"""`fsdp-planner launcher`: write a plan's launch bundle (torchrun / SLURM / Kubernetes / SkyPilot) to a
directory.

The plan comes from a file (`--plan plan.json`, a bare Plan or an API response holding one under
`plan`) or from a server (`--plan-id 42 [--server URL]`, `GET /api/v1/plans/42`). The archive is
the one `GET /api/v1/plans/{id}/launcher` serves: both call `executor.launch.bundle.build_bundle`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import DEFAULT_SERVER, SERVER_ENV, STORED_ID, fail, load_plan, whole_number
from api.cli.printing import stdout_console
from executor.launch.bundle import (
    DEFAULT_CUDA_VERSION,
    DEFAULT_ROCM_VERSION,
    DEFAULT_TORCH_VERSION,
    FORMATS,
    TARGETS,
    BundleTooLargeError,
    PodOptions,
    bundle_name,
    write_bundle,
)
from executor.launch.quoting import UnsafeValueError
from executor.launch.skypilot import TASK_FILE as SKYPILOT_TASK_FILE
from executor.launch.torchtitan import DEFAULT_SERIES, TORCHTITAN_RELEASES, NotOnTorchtitanError


def register(app: typer.Typer) -> None:
    app.command("launcher")(launcher)


def launcher(
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory to write the bundle into.")],
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="A plan JSON file (from `fsdp-planner plan -o` or the API).")
    ] = None,
    plan_id: Annotated[
        int | None, typer.Option(
            "--plan-id", parser=STORED_ID, help="A stored plan's id on the server.",
        )
    ] = None,
    server: Annotated[
        str, typer.Option(help="fsdp-planner server for --plan-id.", envvar=SERVER_ENV)
    ] = DEFAULT_SERVER,
    target: Annotated[str, typer.Option(
        help="torchrun | slurm | k8s | skypilot | all | torchtitan (the plan as a torchtitan 0.3 job)",
    )] = "all",
    fmt: Annotated[str, typer.Option("--format", help="Archive format: tar.gz | zip")] = "tar.gz",
    image: Annotated[
        str | None,
        typer.Option(help="Container image for the Kubernetes manifests (default: the plan's GPU vendor's "
                     "PyTorch image: PyTorch's official one for --torch-version and --cuda-version, AMD's "
                     "rocm/pytorch for --torch-version and --rocm-version)."),
    ] = None,
    torch_version: Annotated[
        str,
        typer.Option(help="The torch the plan runs with: the manifests run "
                     "pytorch/pytorch:<torch>-cuda<cuda>-cudnn9-runtime (NVIDIA GPUs) or "
                     "rocm/pytorch:rocm<rocm>_ubuntu24.04_py3.12_pytorch_release_<torch> (AMD GPUs)."),
    ] = DEFAULT_TORCH_VERSION,
    cuda_version: Annotated[str, typer.Option(help="The CUDA of that image.")] = DEFAULT_CUDA_VERSION,
    rocm_version: Annotated[
        str, typer.Option(help="The ROCm of the image for AMD GPUs, e.g. 7.2 or 6.4.1.")
    ] = DEFAULT_ROCM_VERSION,
    rdma_resource: Annotated[
        str | None,
        typer.Option(help="Extended resource of your RDMA device plugin for every pod, e.g. "
                     "rdma/rdma_shared_device_a (default: a commented-out block in the manifests)."),
    ] = None,
    rdma_count: Annotated[int, typer.Option(
        parser=whole_number(unit="resources per pod", low=1, high=64), help="RDMA resources per pod.",
    )] = 1,
    queue: Annotated[
        str | None,
        typer.Option(help="Kueue LocalQueue for the Kubernetes job: its kueue.x-k8s.io/queue-name label, and "
                     "the job created suspended until Kueue admits it."),
    ] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option("--node-selector", help="KEY=VALUE a pod's node must carry (repeat for several)."),
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(help="Taint the pods tolerate: KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule "
                     "(repeat for several)."),
    ] = None,
    priority_class: Annotated[
        str | None, typer.Option(help="PriorityClass of the pods (Kueue takes the job's priority from it).")
    ] = None,
    gpu_resource: Annotated[
        str | None,
        typer.Option(help="The GPUs' resource name: nvidia.com/gpu | amd.com/gpu (default: the plan's GPU "
                     "vendor's; another vendor's needs --image)."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="API key, if the server requires one for reads.")
    ] = None,
    torchtitan_version: Annotated[
        str,
        typer.Option(help="--target torchtitan: the torchtitan series the job config is written for: 0.3 "
                     "(its Python config module, torchtitan 0.3.0) | 0.2 (its TOML job config, "
                     "torchtitan 0.2.2)."),
    ] = DEFAULT_SERIES,
    no_extract: Annotated[bool, typer.Option("--no-extract", help="Write only the archive.")] = False,
) -> None:
    """Write a launch bundle: launch.sh (torchrun), slurm.sbatch, k8s.yaml, skypilot.yaml, plan.json and the
    runtime."""
    if target not in TARGETS:
        raise fail(f"--target {target!r}: choose one of {', '.join(TARGETS)}")
    if fmt not in FORMATS:
        raise fail(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    plan = load_plan(plan_file, plan_id, server, api_key)
    try:
        archive = write_bundle(
            plan,
            out,
            target=target,  # type: ignore[arg-type]
            fmt=fmt,  # type: ignore[arg-type]
            extract=not no_extract,
            pods=PodOptions(
                image=image, torch_version=torch_version, cuda_version=cuda_version,
                rocm_version=rocm_version, rdma_resource=rdma_resource, rdma_count=rdma_count, queue=queue,
                node_selector=tuple(node_selector or ()), tolerations=tuple(toleration or ()),
                priority_class=priority_class, gpu_resource=gpu_resource,
            ),
            torchtitan_version=torchtitan_version,
        )
    except UnsafeValueError as exc:
        option = f"--{exc.field.replace('_', '-')}: " if exc.field else ""
        raise fail(f"{option}{exc}") from None
    except (BundleTooLargeError, NotOnTorchtitanError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot write to {out}: {exc.strerror or exc}") from None
    console = stdout_console()
    console.print(f"wrote {archive}", highlight=False)
    if not no_extract and target == "torchtitan":
        hf = "--model.hf_assets_path" if torchtitan_version == "0.2" else "--hf_assets_path"
        console.print(
            f"  unpacked in {out / bundle_name(plan)}; run it with:  ./launch.sh {hf} <tokenizer dir> "
            f"--training.steps 1000  (torchtitan=={TORCHTITAN_RELEASES[torchtitan_version]} installed; its "
            "README.md shows the mapping)",
            highlight=False,
            soft_wrap=True,
        )
    elif not no_extract:
        directory = out / bundle_name(plan)
        console.print(
            f"  unpacked in {directory}; run it with:  cd {directory} && DATA=/path/to/dataset ./launch.sh "
            "--steps 1000\n  (DATA: a dataset made by `fsdp-planner prepare-data`; a rehearsal on synthetic "
            "tokens: SYNTHETIC_DATA=1 ./launch.sh --steps 20)",
            highlight=False,
            soft_wrap=True,
        )
        if target in ("skypilot", "all") and (directory / SKYPILOT_TASK_FILE).exists():
            console.print(
                f"  SkyPilot:  cd {directory} && sky launch -c train {SKYPILOT_TASK_FILE} "
                '--env DATA=/path/to/dataset --env TRAIN_ARGS="--steps 1000"',
                highlight=False,
                soft_wrap=True,
            )
