"""Benchmark: small plans while a study and a large re-plan run as jobs (not a test; run on demand).

    python bench/jobs_fairness.py [--engines in-process,procrastinate] [--interval 0.25]

For each engine: `fsdp-planner serve` on an empty database (in-process: SQLite, the jobs run in the web
process; procrastinate: a fresh PostgreSQL database, FSDP_PLANNER_JOB_ENGINE=procrastinate, and one
`fsdp-planner worker` process). First a maximal layer graph (1,024 units, no two alike) is planned (a
plan job, as it is beyond the job threshold) and an out-of-memory run is recorded on its plan. Then, at
the same moment, issue 25's 256-candidate study and the re-plan of that plan are submitted (two jobs),
and while either runs one client sends small `POST /api/v1/plans` (llama-debug on 1x2xcpu, each a new
request, so each searches) one after another, `--interval` seconds apart. Reports the small plans'
latency (median, p99, max) beside the same small plans with nothing running, and the jobs' wall times.
Goal (issue 25): a small POST's p99 <= 1 s while the long work runs.

PostgreSQL: FSDP_PLANNER_TEST_POSTGRES_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)
is the server the benchmark creates (and drops) its database on.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.scratch_database import scratch_database
from bench.study_jobs import STUDY, small_plan

GIB = 1024**3


def maximal_graph() -> dict[str, Any]:
    """A traced model of 1,024 units, no two alike (bench/api_load.py's worst case)."""
    units = [{"name": f"layers.{i}", "num_params": 1_000_000 + i, "fwd_flops_per_token": 4e7,
              "activation_bytes_per_token": 4096} for i in range(1024)]
    return {"model": {"name": "maximal", "architecture": "layer_graph", "layer_graph": units},
            "cluster": "1x8xH100", "training": {"seq_len": 2048, "global_batch_tokens": 2048 * 32}}


OOM_RUN = {"outcome": "oom", "steps": 1, "oom": {
    "step": 2, "phase": "backward", "requested_bytes": 8 * GIB, "allocated_bytes": 70 * GIB,
    "reserved_bytes": 74 * GIB, "message": "CUDA out of memory."}}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command() -> list[str]:
    return [sys.executable, "-m", "api.cli.main"]


def wait_job(client: httpx.Client, location: str, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(location).json()
        if job["state"] not in ("queued", "running"):
            return job
        if time.monotonic() > deadline:
            raise SystemExit(f"{location} still {job['state']} after {timeout_s} s")
        time.sleep(0.1)


def small_latencies(client: httpx.Client, start: int, count: int, interval: float) -> list[float]:
    latencies = []
    for index in range(start, start + count):
        sent = time.perf_counter()
        client.post("/api/v1/plans", json=small_plan(index)).raise_for_status()
        latencies.append(time.perf_counter() - sent)
        time.sleep(interval)
    return latencies


def run(engine: str, interval: float) -> dict[str, Any]:
    with scratch_database("sqlite" if engine == "in-process" else "postgresql") as url:
        port = _port()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("FSDP_PLANNER_") and key != "DATABASE_URL"}
        env.update(DATABASE_URL=url, FSDP_PLANNER_JOB_ENGINE=engine)
        logs = Path(tempfile.mkdtemp())
        server = subprocess.Popen(
            [*_command(), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            env=env, stdout=(logs / "serve.log").open("wb"), stderr=subprocess.STDOUT,
        )
        worker = None
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
                for _ in range(600):
                    try:
                        if client.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
                if engine == "procrastinate":
                    worker = subprocess.Popen([*_command(), "worker", "--name", "bench"], env=env,
                                              stdout=(logs / "worker.log").open("wb"),
                                              stderr=subprocess.STDOUT)
                client.post("/api/v1/plans", json=small_plan(100_000)).raise_for_status()  # warm
                idle = small_latencies(client, 200_000, 20, interval)
                # The plan to re-plan: a maximal graph, itself a plan job.
                big = client.post("/api/v1/plans", json=maximal_graph())
                assert big.status_code == 202, big.text
                started = time.perf_counter()
                planned = wait_job(client, big.headers["location"])
                big_wall = time.perf_counter() - started
                assert planned["state"] == "succeeded", planned
                client.post(f"/api/v1/plans/{planned['plan_id']}/runs", json=OOM_RUN).raise_for_status()

                started = time.perf_counter()
                study = client.post("/api/v1/studies", json=STUDY)
                replan = client.post(f"/api/v1/plans/{planned['plan_id']}/replan")
                assert study.status_code == replan.status_code == 202, (study.text, replan.text)
                walls: dict[str, float] = {}
                busy: list[float] = []
                index = 0
                while len(walls) < 2:
                    for what, location in (("study", study.headers["location"]),
                                           ("replan", replan.headers["location"])):
                        if what not in walls:
                            state = client.get(location).json()
                            if state["state"] not in ("queued", "running"):
                                if state["state"] != "succeeded":
                                    raise SystemExit(f"the {what} ended {state['state']}: {state['error']}")
                                walls[what] = time.perf_counter() - started
                    if len(walls) < 2:
                        busy.extend(small_latencies(client, index, 1, interval))
                        index += 1
                return {"engine": engine, "idle": idle, "busy": busy, "walls": walls, "big_wall": big_wall}
        finally:
            for process in (worker, server):
                if process is not None:
                    process.terminate()
                    process.wait(timeout=60)


def _stats(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (f"n={len(ordered)} median {statistics.median(ordered) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
            f"max {ordered[-1] * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="in-process,procrastinate")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between small plans")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    for engine in args.engines.split(","):
        result = run(engine, args.interval)
        print(f"{engine}: maximal graph (1,024 units) planned as a job in {result['big_wall']:.1f} s")
        print(f"  small POST /plans, nothing running: {_stats(result['idle'])}")
        print(f"  small POST /plans during the study and the re-plan: {_stats(result['busy'])}")
        print(f"  study (256 candidates) {result['walls']['study']:.1f} s, re-plan (1,024 units) "
              f"{result['walls']['replan']:.1f} s, both submitted at once")


if __name__ == "__main__":
    main()
