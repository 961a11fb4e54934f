"""A CPU job's process groups are gloo with one worker thread, the world's and its mesh's alike.

torch's default gloo group runs two worker threads; with two, dozens of all-gathers in flight (a
compiled SimpleFSDP step's) corrupted the heap about once in twenty CPU runs on a loaded machine
(`bench/gloo_in_flight.py`, bench/RESULTS.md). The trainer and the profiler start their groups through
`executor.runtime.distributed.cpu_backend`; this checks what they get, in a process of its own (a
default process group is process-wide state).
"""

from __future__ import annotations

import json
import subprocess
import sys

from executor.runtime.distributed import CPU_BACKEND, GLOO_WORKER_THREADS
from tests.executor.conftest import REPO, job_env

PROBE = """
import json
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from contract.mesh import WORLD_AXES
from executor.runtime.distributed import cpu_backend

dist.init_process_group(cpu_backend(), store=dist.HashStore(), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,) * len(WORLD_AXES), mesh_dim_names=WORLD_AXES)
cpu = torch.device("cpu")
groups = [dist.group.WORLD, *(mesh.get_group(axis) for axis in WORLD_AXES)]
gathered = torch.ops._c10d_functional.all_gather_into_tensor.default(torch.arange(4.0), 1,
                                                                      dist.group.WORLD.group_name)
print(json.dumps({
    "backend": dist.get_backend(),
    "kinds": sorted({type(g._get_backend(cpu)).__name__ for g in groups}),
    "threads": sorted({g._get_backend(cpu).options._threads for g in groups}),
    "gathered": torch.ops._c10d_functional.wait_tensor.default(gathered).tolist(),
}))
dist.destroy_process_group()
"""


def test_cpu_jobs_run_gloo_with_one_worker_thread_in_every_group() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=job_env(), capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["backend"] == CPU_BACKEND
    assert seen["kinds"] == ["ProcessGroupGloo"]
    assert seen["threads"] == [GLOO_WORKER_THREADS] == [1]
    assert seen["gathered"] == [0.0, 1.0, 2.0, 3.0]  # the functional collectives compiled graphs call
