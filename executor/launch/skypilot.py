"""The SkyPilot task of a launch bundle (skypilot.yaml), as data: the plan's nodes and accelerators,
the bundle directory as the workdir SkyPilot copies to every node, a setup that installs the bundle's
requirements, and a run that starts launch.sh (torchrun) on every node with the rendezvous taken from
SkyPilot's environment (SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE). render.py
dumps it between the comments of templates/skypilot.yaml.j2; the scripts are templates
(parts/skypilot_setup.sh.j2, parts/skypilot_run.sh.j2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contract.float8 import TORCHAO_REQUIREMENT
from executor.launch import vendors
from executor.launch.quoting import UnsafeValueError
from executor.launch.templating import Script, render_template

if TYPE_CHECKING:
    from executor.launch.render import LaunchContext
    from planner.gpu_spec import GpuSpec

Document = dict[str, Any]

ACCELERATORS: dict[str, str] = {
    "H100-SXM-80GB": "H100",
    "H200-141GB": "H200",
    "A100-80GB": "A100-80GB",
    "A100-40GB": "A100",
    "L4": "L4",
    "L40S": "L40S",
    "B200": "B200",
}
"""SkyPilot's accelerator name for each catalog GPU (`sky show-gpus` lists them)."""
UNAVAILABLE: dict[str, str] = {
    "H100-SXM-96GB": "the 96 GB H100 (HBM2e) of Meta's Grand Teton servers is not offered by clouds, whose "
    "H100 has 80 GB: plan for H100-SXM-80GB (SkyPilot's H100) so that the memory the plan fits in is there",
    "GB200": "GB200 NVL72 racks are rented whole and scheduled by their NVLink domain, which a SkyPilot "
    "accelerator count does not express: use the slurm or k8s target",
    "GB300": "GB300 NVL72 racks are rented whole and scheduled by their NVLink domain, which a SkyPilot "
    "accelerator count does not express: use the slurm or k8s target",
    "B300": "SkyPilot's catalog names no B300 accelerator yet: use the slurm or k8s target",
    "H20": "the H20 is sold in China only, and no cloud SkyPilot reaches offers it: use the slurm or k8s "
    "target",
    "H800": "the H800 is sold in China only, and no cloud SkyPilot reaches offers it: use the slurm or k8s "
    "target",
}
"""Catalog GPUs SkyPilot cannot ask a cloud for, with why."""
TASK_FILE = "skypilot.yaml"
REQUIREMENTS_FILE = "requirements.txt"


class NotOnSkyPilotError(UnsafeValueError):
    """The plan's GPU is none that SkyPilot can request."""


@dataclass(frozen=True, slots=True)
class SkyContext:
    """What the SkyPilot task needs beyond LaunchContext (validated by bundle.py)."""

    accelerator: str | None
    """SkyPilot's name of the plan's GPU (None: a CPU plan, which asks for cores)."""
    requirements: tuple[str, ...]
    """What setup installs (requirements.txt): the torch the plan was made for, torchao for Float8."""
    image: str | None = None
    """A container image to run in (`image_id: docker:...`); None: the cloud's default image."""


def accelerator(gpu: GpuSpec) -> str | None:
    """SkyPilot's name of a catalog GPU (None for `cpu`); refuses one that SkyPilot cannot request."""
    if gpu.is_cpu:
        return None
    if vendors.vendor_of(gpu) == "amd":
        raise NotOnSkyPilotError(
            f"target skypilot: the task's setup installs PyTorch's CUDA wheels, and {gpu.name} needs a ROCm "
            "build of torch: use the torchrun, slurm or k8s target (its manifests run AMD's ROCm image)",
            field="target",
        )
    if gpu.name in UNAVAILABLE:
        raise NotOnSkyPilotError(f"target skypilot: {UNAVAILABLE[gpu.name]}", field="target")
    if gpu.name not in ACCELERATORS:
        raise NotOnSkyPilotError(
            f"target skypilot: no SkyPilot accelerator is known for {gpu.name}", field="target"
        )
    return ACCELERATORS[gpu.name]


def requirements(*, torch_version: str, float8: str) -> tuple[str, ...]:
    """The bundle's requirements: torch at the plan's version, and torchao where the plan uses Float8."""
    return (f"torch=={torch_version}", *((TORCHAO_REQUIREMENT,) if float8 != "none" else ()))


def resources(ctx: LaunchContext, sky: SkyContext) -> Document:
    """Each node's accelerators (`H100:8`), or for a CPU plan at least its process count in cores."""
    requested: Document = (
        {"accelerators": f"{sky.accelerator}:{ctx.gpus_per_node}"}
        if sky.accelerator
        else {"cpus": f"{ctx.gpus_per_node}+"}
    )
    if sky.image:
        requested["image_id"] = f"docker:{sky.image}"
    return requested


def task(ctx: LaunchContext, sky: SkyContext) -> Document:
    """The SkyPilot task: `sky launch` it from the bundle directory (the workdir, copied to every node)."""
    return {
        "name": ctx.k8s_name,
        "num_nodes": ctx.num_nodes,
        "resources": resources(ctx, sky),
        "workdir": ".",
        # Empty by default: launch.sh refuses to start until DATA or SYNTHETIC_DATA says what to train on.
        "envs": {"DATA": "", "SYNTHETIC_DATA": "0", "CHECKPOINT_DIR": "", "TRAIN_ARGS": ""},
        "setup": Script(
            render_template("parts/skypilot_setup.sh.j2", requirements_file=REQUIREMENTS_FILE, sky=sky)
        ),
        "run": Script(render_template("parts/skypilot_run.sh.j2", ctx=ctx)),
    }
