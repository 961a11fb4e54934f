"""The environment a GPU cluster expects around the trainer: allocator, NCCL error handling and
network selection, the process-group timeout, torchrun's shutdown grace, OpenMP threads; on AMD GPUs
also the ROCm runtime's and RCCL's own settings (`ROCM_ENV`: RCCL reads the NCCL_* variables itself).

One table per vendor (`table`: `CLUSTER_ENV`, with `ROCM_ENV` for AMD) renders everywhere it appears,
so the scripts, the manifests and the READMEs never disagree: the header block of `launch.sh` /
`slurm.sbatch`, the bash that applies the defaults, the Kubernetes `env` lists and the bundle README's
table (`shown()` gives the templates their rows: templates/parts/cluster_env*.j2). Every variable is a
*default*: a value already in the environment wins, and a variable whose default is empty stays unset
(NCCL then picks by itself) unless the user sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.launch.quoting import sh
from executor.launch.vendors import Vendor
from planner.cost.memory import PRICED_ALLOCATOR_CONFIG

PG_TIMEOUT_ENV = "FSDP_PG_TIMEOUT_S"
"""Read by executor/runtime/distributed.py (`pg_timeout_s`): the trainer's process-group timeout."""
SHUTDOWN_GRACE_S = 240
"""Seconds torchrun waits for trainer processes to save and exit after SIGTERM before SIGKILL."""
TERMINATION_GRACE_S = 300
"""Kubernetes terminationGracePeriodSeconds, and SLURM's --signal lead time: > SHUTDOWN_GRACE_S."""


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    default: str
    """'' : left unset unless the user sets it. OMP_NUM_THREADS is computed per script instead."""
    doc: str
    """One line for the script header (comment-safe ASCII, <= 62 characters)."""
    readme: str
    """What it does and why this default, for the bundle README."""


CLUSTER_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "PYTORCH_CUDA_ALLOC_CONF",
        PRICED_ALLOCATOR_CONFIG,
        "the allocator the plan's memory model assumes",
        "The caching allocator with expandable segments (little fragmentation): the allocator the "
        "planner's memory model prices (`planner/cost/memory.py`). Another value changes the peak.",
    ),
    EnvVar(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "1",
        "a failed or timed-out collective aborts NCCL, ends the rank",
        "1: when a collective fails or outlives the process-group timeout, the watchdog aborts the "
        "communicator and ends the process, so torchrun and SLURM see a failure instead of a hang "
        "(torch's own default, 3, ends it without the abort).",
    ),
    EnvVar(
        "TORCH_NCCL_BLOCKING_WAIT",
        "",
        "1: wait() blocks until the collective ends (debugging)",
        "1 makes every `wait()` block the CPU until its collective completes or times out: "
        "exact error sites for debugging, slower steps.",
    ),
    EnvVar(
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "",
        "flight recorder: events kept per rank (e.g. 2000)",
        "A positive number turns on the NCCL flight recorder, the last N collectives of "
        "each rank; with TORCH_NCCL_DUMP_ON_TIMEOUT=1 they are written out when a collective times out.",
    ),
    EnvVar(
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "",
        "1: dump the flight recorder on a timeout",
        "1 (with TORCH_NCCL_TRACE_BUFFER_SIZE > 0) dumps the flight recorder to "
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default /tmp/nccl_trace_rank_N) when a collective times out.",
    ),
    EnvVar(
        "NCCL_DEBUG",
        "WARN",
        "WARN: NCCL explains its errors; INFO: also its set-up",
        "WARN: NCCL prints why it failed. INFO also prints the transports and interfaces it chose at "
        "start (the first thing to check on a new cluster); TRACE is very verbose.",
    ),
    EnvVar(
        "NCCL_SOCKET_IFNAME",
        "",
        "network interface for NCCL's sockets, e.g. ib0 or ^lo,docker",
        "Unset: NCCL picks an interface. Set it when it picks the wrong one (a docker bridge, a slow "
        "management network): `ib0`, `eth0`, a prefix list `en,eth`, or `^lo,docker` to exclude.",
    ),
    EnvVar(
        "NCCL_IB_HCA",
        "",
        "InfiniBand/RoCE adapters NCCL uses, e.g. mlx5_0,mlx5_1",
        "Unset: NCCL uses every RDMA adapter it finds. Name the ones wired to the GPU fabric "
        "(`mlx5_0,mlx5_1`, `=mlx5_0:1` for an exact port) or exclude some (`^mlx5_bond_0`).",
    ),
    EnvVar(
        "GLOO_SOCKET_IFNAME",
        "",
        "network interface for gloo (CPU plans), e.g. eth0",
        "Unset: gloo resolves the host name. CPU plans train over gloo; set the interface when the "
        "host name resolves to an address the other nodes cannot reach.",
    ),
    EnvVar(
        PG_TIMEOUT_ENV,
        "1800",
        "seconds a collective may wait for its peers (trainer)",
        "The trainer's process-group timeout in seconds (torch's default, 30 minutes): a collective "
        "that waits longer for its peers fails the job. Lower it to find hangs sooner; raise it when "
        "a slow first step (compilation, checkpoint loading) trips it.",
    ),
    EnvVar(
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        str(SHUTDOWN_GRACE_S),
        "seconds torchrun lets ranks save and exit after SIGTERM",
        f"When torchrun is told to stop (SIGTERM, e.g. a Kubernetes pod deletion) it passes the signal "
        f"to the trainer processes, which stop after the current step and save a checkpoint; it waits "
        f"this long ({SHUTDOWN_GRACE_S} s) before killing them (torch's default is 30 s).",
    ),
    EnvVar(
        "OMP_NUM_THREADS",
        "",
        "CPU threads per rank (default: cores / processes)",
        "Default: the node's cores divided by the processes per node (at least 1), instead of "
        "torchrun's 1 with a warning. CPU plans compute with these threads.",
    ),
)


ROCM_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "PYTORCH_HIP_ALLOC_CONF",
        PRICED_ALLOCATOR_CONFIG,
        "the allocator the plan's memory model assumes (HIP)",
        "The caching allocator's settings as a ROCm build of torch reads them: this name before "
        "PYTORCH_CUDA_ALLOC_CONF, so it is set to the same priced configuration (an image that sets it "
        "otherwise would change the peak).",
    ),
    EnvVar(
        "HSA_NO_SCRATCH_RECLAIM",
        "1",
        "1: keep kernels' scratch memory between launches",
        "1: the ROCm runtime keeps the scratch memory a kernel was given instead of reclaiming it after "
        "each launch, which stalls the queue; AMD's training containers set it for MI300-series GPUs.",
    ),
    EnvVar(
        "TORCH_BLAS_PREFER_HIPBLASLT",
        "1",
        "1: GEMMs through hipBLASLt (the tuned MI300 kernels)",
        "1: torch runs its matrix multiplications through hipBLASLt rather than rocBLAS: the library "
        "AMD tunes for Instinct GPUs and the one whose speed calibration measures.",
    ),
    EnvVar(
        "NCCL_IB_GID_INDEX",
        "",
        "RoCE: the GID index RCCL uses, e.g. 3 for RoCEv2",
        "Unset: RCCL picks the adapter's default GID. On RoCE fabrics (the usual scale-out network of "
        "AMD clusters) name the RoCEv2 GID, often `3` (`show_gids` lists them).",
    ),
    EnvVar(
        "HSA_FORCE_FINE_GRAIN_PCIE",
        "",
        "1: RCCL peer-to-peer between PCIe-connected GPUs",
        "Unset: GPUs of one node talk over Infinity Fabric. Set `1` where they are connected by PCIe "
        "only, so that RCCL may copy between them directly (it needs large-BAR support).",
    ),
)
"""What AMD GPUs add (ROCm's HIP runtime and RCCL; AMD's RCCL usage tips and training containers)."""


def table(vendor: Vendor = "nvidia") -> tuple[EnvVar, ...]:
    """The variables a vendor's scripts and manifests set: the common table, then the vendor's own."""
    return CLUSTER_ENV + (ROCM_ENV if vendor == "amd" else ())


@dataclass(frozen=True, slots=True)
class Shown:
    """The table as the templates show it (templates/parts/cluster_env*.j2)."""

    header_rows: list[tuple[str, str, str]]
    """(name, default, doc) for the scripts' header block."""
    width: int
    """The longest name: the header's column."""
    bash_words: list[tuple[str, str]]
    """(name, its default as one bash word) for the scripts' `env_default` calls."""
    positive: tuple[str, ...]
    """The variables the scripts refuse unless they hold a positive whole number."""
    readme_rows: list[tuple[str, str, str]]
    """(name, default, what it does) for the bundle README's table."""


def shown(vendor: Vendor = "nvidia") -> Shown:
    """The vendor's table in the forms the scripts and the README show it; OMP_NUM_THREADS is computed
    per script (the node's cores over its processes)."""
    omp = "OMP_NUM_THREADS"
    variables = table(vendor)
    return Shown(
        header_rows=[
            (v.name, "cores/procs" if v.name == omp else (v.default or "(unset)"), v.doc) for v in variables
        ],
        width=max(len(v.name) for v in variables),
        bash_words=[(v.name, '"$PER_RANK"' if v.name == omp else sh(v.default)) for v in variables],
        positive=(PG_TIMEOUT_ENV, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", omp),
        readme_rows=[
            (
                v.name,
                "cores / processes" if v.name == omp else (f"`{v.default}`" if v.default else "unset"),
                v.readme,
            )
            for v in variables
        ],
    )


def static_defaults(vendor: Vendor = "nvidia") -> dict[str, str]:
    """The variables with a fixed default: what a manifest sets, and what a process started from
    Python gets under the values already in its environment (`fsdp-planner calibrate` profiles under
    the launchers' allocator, so that the reserve it measures is the one plans run with).
    OMP_NUM_THREADS is computed per script."""
    return {v.name: v.default for v in table(vendor) if v.default and v.name != "OMP_NUM_THREADS"}


def k8s_env(vendor: Vendor = "nvidia") -> tuple[list[tuple[str, str]], list[str]]:
    """(set, optional): the static defaults a manifest lists, and the names it shows commented out.
    OMP_NUM_THREADS is left to launch.sh (it counts the pod's cores)."""
    given = list(static_defaults(vendor).items())
    optional = [v.name for v in table(vendor) if not v.default and v.name != "OMP_NUM_THREADS"]
    return given, optional
