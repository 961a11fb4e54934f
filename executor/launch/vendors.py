"""The GPU vendor's launch stack: what a bundle asks a cluster for, and runs in, by the plan's GPU.

NVIDIA GPUs run PyTorch's CUDA build with NCCL and are requested as `nvidia.com/gpu`; AMD Instinct
GPUs run a ROCm build of torch, whose `torch.cuda` is HIP and whose `nccl` backend is RCCL (which
reads the same NCCL_* variables), and are requested as `amd.com/gpu` (AMD's device plugin). The
plan's GPU decides the stack (`stack_for`); a cluster whose pods get another vendor's GPUs says so
with its GPU resource and its own image (bundle.py refuses the resource without the image).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from executor.launch.quoting import CUDA_VERSION_PATTERN, ROCM_VERSION_PATTERN, version
from planner.gpu_spec import GpuSpec

Vendor = Literal["nvidia", "amd"]
DEFAULT_CUDA_VERSION = "13.0"
"""The CUDA of PyTorch's official image for the runtime's torch (bundle.DEFAULT_TORCH_VERSION)."""
DEFAULT_ROCM_VERSION = "7.2"
"""The ROCm of AMD's PyTorch image (`rocm/pytorch`) the AMD bundles name by default."""
ROCM_IMAGE_OS = "ubuntu24.04_py3.12"
"""The OS and Python part of AMD's `rocm/pytorch` release tags."""


@dataclass(frozen=True, slots=True)
class Stack:
    """One vendor's software around the trainer."""

    vendor: Vendor
    runtime: str
    """The GPU runtime torch is built for, as a person names it (`CUDA`, `ROCm`)."""
    collectives: str
    """The library behind torch's `nccl` backend (`NCCL`, `RCCL`)."""
    gpu_resource: str
    """The Kubernetes extended resource its device plugin advertises."""
    version_option: str
    """The launcher option that names the runtime's version (`--cuda-version`, `--rocm-version`)."""
    default_version: str
    version_pattern: str
    images: str
    """Whose images the manifests run by default, for the bundle's README and comments."""
    fabric: str
    """The scale-up fabric between its GPUs, as a person names it (`NVLink`, `Infinity Fabric`)."""

    def image(self, *, torch_version: str, runtime_version: str) -> str:
        """The vendor's PyTorch image for a torch and runtime version: PyTorch's official CUDA runtime
        image (`pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime`), or AMD's ROCm release image
        (`rocm/pytorch:rocm7.2_ubuntu24.04_py3.12_pytorch_release_2.13.0`)."""
        field = f"{self.runtime.lower()}_version"
        version(runtime_version, self.version_pattern, field=field, example=self.default_version)
        if self.vendor == "amd":
            return f"rocm/pytorch:rocm{runtime_version}_{ROCM_IMAGE_OS}_pytorch_release_{torch_version}"
        return f"pytorch/pytorch:{torch_version}-cuda{runtime_version}-cudnn9-runtime"


NVIDIA = Stack(
    vendor="nvidia",
    runtime="CUDA",
    collectives="NCCL",
    gpu_resource="nvidia.com/gpu",
    version_option="--cuda-version",
    default_version=DEFAULT_CUDA_VERSION,
    version_pattern=CUDA_VERSION_PATTERN,
    images="PyTorch's official image",
    fabric="NVLink",
)
AMD = Stack(
    vendor="amd",
    runtime="ROCm",
    collectives="RCCL",
    gpu_resource="amd.com/gpu",
    version_option="--rocm-version",
    default_version=DEFAULT_ROCM_VERSION,
    version_pattern=ROCM_VERSION_PATTERN,
    images="AMD's ROCm PyTorch image",
    fabric="Infinity Fabric",
)
STACKS: dict[str, Stack] = {stack.vendor: stack for stack in (NVIDIA, AMD)}


AMD_CHIP_PREFIX = "CDNA"
"""AMD Instinct dies are named by their architecture (`CDNA3`: MI300X, MI325X; `CDNA4`: MI355X)."""


def vendor_of(gpu: GpuSpec) -> Vendor:
    """Who makes a GPU type, by its die: AMD's CDNA dies, else NVIDIA's (the catalog's other dies, and
    a custom GPU that names none: name its `chip` CDNA3 to launch it as an AMD GPU)."""
    return "amd" if (gpu.chip or "").upper().startswith(AMD_CHIP_PREFIX) else "nvidia"


def stack_for(gpu: GpuSpec) -> Stack:
    """The stack a plan's GPU runs on (a CPU plan runs in the CUDA image, which computes on CPUs too)."""
    return STACKS[vendor_of(gpu)]


def stack_of_resource(gpu_resource: str) -> Stack:
    """The stack whose device plugin advertises `gpu_resource` (a checked one of scheduling.GPU_RESOURCES)."""
    return next(stack for stack in STACKS.values() if stack.gpu_resource == gpu_resource)
