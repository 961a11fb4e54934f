"""Process group, device and device-mesh set-up from the launcher's environment and the plan."""

from __future__ import annotations

import ctypes
import datetime
import importlib.util
import io
import math
import os
import socket
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from contract.mesh import WORLD_AXES, data_parallel_axes
from contract.plan_document import RuntimePlan


def exit_process(code: int) -> NoReturn:
    """End a distributed entry point without interpreter teardown.

    Even after `destroy_process_group`, gloo's worker threads can outlive `main()`; finalizing the
    interpreter then destroys what they hold and aborts the process ("terminate called without an
    active exception", SIGABRT) in about one CPU run out of three, so torchrun reports a finished
    run as failed. Callers have closed their files and process groups; only the streams remain.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class LaunchError(RuntimeError):
    """The processes were started in a way that does not fit the plan (reported without traceback)."""


@dataclass(frozen=True, slots=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    """Global rank."""
    local_rank: int
    """Rank on this node (selects the GPU)."""
    world_size: int
    """All ranks of the job."""
    device: torch.device
    """cuda:<local_rank>, or cpu."""
    backend: str
    """nccl on GPUs, gloo on CPU."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise LaunchError(f"environment variable {name}={value!r} is not an integer") from None


def check_world_size(plan: RuntimePlan, world_size: int) -> None:
    """Refuse to start with a different number of ranks than the plan shards over."""
    expected = plan.world_size
    if world_size == expected:
        return
    cluster = plan.cluster
    raise LaunchError(
        f"this plan is for {expected} ranks (cluster {cluster.num_nodes} node(s) x "
        f"{cluster.gpus_per_node} x {cluster.gpu}), but the job has WORLD_SIZE={world_size}. Start "
        f"{cluster.gpus_per_node} processes on each of {cluster.num_nodes} node(s): `./launch.sh` "
        f"does that by default (check NPROC_PER_NODE and NNODES if you set them), or make a plan for "
        f"the cluster you have."
    )


def _object_collectives_without_numpy() -> None:
    """Let object collectives (which DCP uses for its save/load plans) run without NumPy.

    torch 2.13 decodes received objects with `tensor.numpy().tobytes()`, so on a machine with
    torch but no NumPy every distributed checkpoint fails ("Numpy is not available"). When NumPy is
    missing, replace that one decoding helper with a byte copy that needs nothing but ctypes.
    """
    if importlib.util.find_spec("numpy") is not None:
        return
    import torch.distributed.distributed_c10d as c10d

    if getattr(c10d, "_fsdp_planner_numpy_free", False) or not hasattr(c10d, "_tensor_to_object"):
        return

    def tensor_to_object(tensor: torch.Tensor, tensor_size: object, group: object = None) -> object:
        data = tensor.detach().cpu().contiguous()
        size = min(int(tensor_size), data.numel() * data.element_size())  # type: ignore[call-overload]
        return c10d._unpickler(io.BytesIO(ctypes.string_at(data.data_ptr(), size))).load()

    c10d._tensor_to_object = tensor_to_object
    c10d._fsdp_planner_numpy_free = True


PG_TIMEOUT_ENV = "FSDP_PG_TIMEOUT_S"
"""Seconds a collective may wait before the process group fails it (the launch scripts set it)."""
DEFAULT_PG_TIMEOUT_S = 1800.0
"""torch's own default for NCCL and gloo process groups (30 minutes)."""


def pg_timeout_s() -> float:
    """The process-group timeout from FSDP_PG_TIMEOUT_S (default 1800 s): how long a collective may
    wait for its peers before the watchdog fails it (and, with TORCH_NCCL_ASYNC_ERROR_HANDLING=1,
    ends the process so that torchrun sees the failure instead of a hang)."""
    raw = os.environ.get(PG_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_PG_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 7 * 24 * 3600:  # also refuses nan and inf
        raise LaunchError(
            f"{PG_TIMEOUT_ENV}={raw!r}: give the process-group timeout in seconds (a positive number, "
            "at most a week), e.g. 1800"
        )
    return value


GLOO_WORKER_THREADS = 1
"""Worker threads of a CPU job's gloo process groups (torch's own default: 2 per network device).
With two, torch 2.13's gloo corrupted glibc's heap when all-gathers ran on both at once: a compiled
SimpleFSDP step issues its dozens of all-gathers together, and about one CPU run in twenty on a loaded
2-core machine died of it (`malloc(): unaligned tcache chunk detected`, SIGABRT on one rank, a
connection reset on its peer). `bench/gloo_in_flight.py` reproduces it without compile or this
project's code. One thread runs a group's collectives one at a time in issue order, still beside the
computation, as a GPU job's NCCL stream does."""
CPU_BACKEND = "gloo_serial"
"""The torch.distributed backend name of a CPU job's process groups: gloo with
`GLOO_WORKER_THREADS` worker threads (`cpu_backend` registers it)."""


def start_process_group(device: torch.device, timeout: datetime.timedelta) -> None:
    """The default process group for ranks on `device`: nccl on GPUs (bound to the rank's device),
    gloo with `GLOO_WORKER_THREADS` worker threads on CPU (`cpu_backend`). Device meshes create their
    groups with the default group's backend, so every group of the job gets the same."""
    if device.type == "cuda":
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group(cpu_backend(), timeout=timeout)


def cpu_backend() -> str:
    """`CPU_BACKEND`, registered with torch.distributed on first use."""
    if not hasattr(dist.Backend, CPU_BACKEND.upper()):
        dist.Backend.register_backend(CPU_BACKEND, _serial_gloo, devices=["cpu"])
    return CPU_BACKEND


def _serial_gloo(
    store: dist.Store, rank: int, size: int, timeout: datetime.timedelta
) -> dist.ProcessGroupGloo:
    """A gloo process group as torch makes one (the network interfaces GLOO_SOCKET_IFNAME names, else
    the host's default), with `GLOO_WORKER_THREADS` worker threads."""
    gloo = dist.ProcessGroupGloo
    options = gloo._Options()
    interfaces = [name for name in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if name]
    devices = [gloo.create_device(interface=name) for name in interfaces]
    options._devices = devices or [gloo.create_default_device()]
    options._timeout = timeout
    options._threads = GLOO_WORKER_THREADS
    return gloo(store, rank, size, options)


def init_distributed(plan: RuntimePlan, *, device: str = "auto", timeout_s: float | None = None) -> DistEnv:
    """Check the world size, pick device and backend, and start the default process group (its
    timeout: `timeout_s`, else FSDP_PG_TIMEOUT_S, else 30 minutes)."""
    timeout_s = pg_timeout_s() if timeout_s is None else timeout_s
    _object_collectives_without_numpy()
    standalone = "RANK" not in os.environ
    world_size = _env_int("WORLD_SIZE", 1)
    check_world_size(plan, world_size)
    if standalone:
        # `python -m executor.runtime.train` without torchrun: a one-rank job.
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise LaunchError("--device cuda: no CUDA device is visible to this process")
        if local_rank >= torch.cuda.device_count():
            raise LaunchError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible on this node; "
                "lower NPROC_PER_NODE or check CUDA_VISIBLE_DEVICES"
            )
        torch.cuda.set_device(local_rank)
        dev, backend = torch.device("cuda", local_rank), "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        start_process_group(dev, datetime.timedelta(seconds=timeout_s))
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, backend=backend)


def build_mesh(plan: RuntimePlan, env: DistEnv) -> DeviceMesh:
    """The job's one 5-D mesh, (pp, dp_replicate, dp_shard, cp, tp) from `plan.config.mesh` (size-1
    dims kept), with the data-parallel groups of the plan's sharding created (`data_parallel_mesh`).
    The engines take their data-parallel dims by name, so pp (the outermost: a stage is a block of
    world / pp consecutive ranks) never enters a gradient reduction; the stages exchange
    activations over the pp dim (`pipeline_mesh`).

    Ranks are laid out row-major with tp innermost: a tensor-parallel group is tp consecutive ranks
    (one node), whose per-layer collectives need the fastest links; then the context-parallel
    groups (cp x tp consecutive ranks: its key/value all-gathers run once per block); then the shard
    groups, so parameter all-gathers and reduce-scatters stay within nodes when they fit, and only
    the replicas' all-reduce crosses nodes. Every engine takes its submeshes from this mesh (FSDP2
    needs its data-parallel mesh and the tensor-parallel mesh to share a root).
    """
    mesh = init_device_mesh(env.device.type, plan.config.mesh.shape, mesh_dim_names=WORLD_AXES)
    data_parallel_mesh(mesh, plan.config.sharding)  # every rank creates the groups now, in step
    return mesh


def submesh(mesh: DeviceMesh, dims: tuple[str, ...]) -> DeviceMesh:
    """The submesh of `mesh` over the named dims (one name: a 1-D mesh)."""
    return mesh[dims[0]] if len(dims) == 1 else mesh[dims]


def _data_parallel_groups(mesh: DeviceMesh, sharding: str) -> tuple[tuple[str, ...], ...]:
    """Per data-parallel dim of `sharding`, the consecutive axes of `mesh` it spans."""
    axes = data_parallel_axes(sharding)
    if mesh.size(WORLD_AXES.index("cp")) == 1:
        return tuple((axis,) for axis in axes if axis != "cp")
    if sharding == "no_shard":
        # Replicas over dp_replicate x cp; dp_shard (1 for no_shard) lies between them.
        return (("dp_replicate", "dp_shard", "cp"),)
    at = axes.index("cp")
    return (*((axis,) for axis in axes[: at - 1]), (axes[at - 1], "cp"))


def data_parallel_dims(mesh: DeviceMesh, sharding: str) -> tuple[str, ...]:
    """The names of the dims that `sharding` spreads parameters and gradient reduction over:
    `contract.mesh.data_parallel_axes`, with cp folded into the axis before it.

    The cp ranks of a data-parallel rank hold the same parameters, so FSDP shards over dp_shard x cp
    (torchtitan's `dp_shard_cp`) and no_shard replicates over dp_replicate x cp (`dp_replicate_cp`):
    the engines take one dim per role (shard, replicate). With cp 1 the dims are the axes
    themselves (`dp_shard`, or `dp_replicate` and `dp_shard`), as before context parallelism.
    """
    merged = {("dp_shard", "cp"): "dp_shard_cp", ("dp_replicate", "dp_shard", "cp"): "dp_replicate_cp"}
    return tuple(merged.get(group, group[0]) for group in _data_parallel_groups(mesh, sharding))


def data_parallel_mesh(mesh: DeviceMesh, sharding: str, *, with_tp: bool = False) -> DeviceMesh:
    """The data-parallel mesh the FSDP engines shard and reduce over (`data_parallel_dims`), with
    the tp dim after them when `with_tp` (SimpleFSDP's combined mesh for tensor-parallel weights).

    With cp > 1 a data-parallel dim spans several axes of `mesh`: the axes involved are flattened
    into one dim and unflattened into the merged dims (torch wants flattened meshes kept by the
    caller, not sliced back out of the root mesh by name). Flattening is collective and idempotent:
    every rank makes the same calls, and repeating one reuses its process groups.
    """
    groups = _data_parallel_groups(mesh, sharding) + ((("tp",),) if with_tp else ())
    names = data_parallel_dims(mesh, sharding) + (("tp",) if with_tp else ())
    if all(len(group) == 1 for group in groups):
        return submesh(mesh, names)
    made: dict[tuple[str, ...], DeviceMesh] = mesh.__dict__.setdefault("_fsdp_planner_merged", {})
    if names not in made:  # kept on the mesh: the merged meshes are made once, with their groups
        axes = tuple(axis for group in groups for axis in group)
        if len(groups) == 1:
            made[names] = submesh(mesh, axes)._flatten(names[0])
        else:
            flat = submesh(mesh, axes)._flatten("_x_".join(axes))
            sizes = tuple(math.prod(mesh.size(WORLD_AXES.index(a)) for a in group) for group in groups)
            made[names] = flat._unflatten(0, sizes, names)
    return made[names]


def tensor_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D tensor-parallel submesh (this rank's tp group)."""
    return mesh["tp"]


def context_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D context-parallel submesh (this rank's cp group: the ranks splitting its sequences)."""
    return mesh["cp"]


def data_parallel_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """(rank, size) of this rank among the data-parallel ranks (dp_replicate x dp_shard): the ranks
    of one cp x tp group share a data-parallel rank, so they read the same sequences (the cp ranks
    then each keep their own chunks of them, `context_parallel`), and so do the pipeline ranks of
    one (the first stage takes the inputs, the last the targets)."""
    replicate, shard = mesh.get_local_rank("dp_replicate"), mesh.get_local_rank("dp_shard")
    replicas, shards = (mesh.size(WORLD_AXES.index(axis)) for axis in ("dp_replicate", "dp_shard"))
    return replicate * shards + shard, replicas * shards


def pipeline_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D pipeline submesh (this rank's pp group: the ranks holding the other stages of its
    data-parallel, context- and tensor-parallel position)."""
    return mesh["pp"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
