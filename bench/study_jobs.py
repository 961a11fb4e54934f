"""Benchmark: small plans beside a maximal study, now that studies are jobs (not a test; run on demand).

    python bench/study_jobs.py [--workers 1,2] [--interval 0.25]

Starts `fsdp-planner serve` on an empty SQLite database once per entry of `--workers` (the study search
pool's size, FSDP_PLANNER_STUDY_SEARCH_WORKERS), submits issue 25's 256-candidate study (llama3-8b on
H100 and A100 clusters of 16 to 2,048 GPUs in steps of 16) and, while its job runs, sends small
`POST /api/v1/plans` one after another (each a new request, so each searches) every `--interval`
seconds. Reports the study's wall time (submit to succeeded) and the small plans' latency: median, 99th
percentile, max. Goals (issue 25): p99 <= 1 s (it was 74.8 s when a study ran inside its request);
speed-up of the study from 1 to 2 workers >= 1.7x on a 2-core machine.
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

import httpx

STUDY = {
    "model": "llama3-8b", "token_budget": 15 * 10**12, "gpus": [{"gpu": "H100"}, {"gpu": "A100"}],
    "cluster_sizes": {"min_gpus": 16, "max_gpus": 2048, "progression": "step", "step": 16},
    "seq_len": 8192, "global_batch_tokens": 4 * 2**20,
}


def small_plan(index: int) -> dict[str, object]:
    """A cheap request that no earlier one matches (so it searches rather than hits the stored plan)."""
    return {"model": "llama-debug", "cluster": "1x2xcpu",
            "training": {"seq_len": 256, "global_batch_tokens": 512 * (index + 1)}}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(workers: int, interval: float) -> tuple[float, list[float], int]:
    """(study wall time, small plans' latencies, candidates) with a study search pool of `workers`."""
    workdir = Path(tempfile.mkdtemp())
    port = _port()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'bench.db'}",
           "FSDP_PLANNER_STUDY_SEARCH_WORKERS": str(workers)}
    server = subprocess.Popen(
        [sys.executable, "-m", "api.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            for _ in range(600):
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            client.post("/api/v1/plans", json=small_plan(10_000)).raise_for_status()  # warm
            start = time.perf_counter()
            submitted = client.post("/api/v1/studies", json=STUDY)
            submitted.raise_for_status()
            location = submitted.headers["location"]
            latencies: list[float] = []
            index = 0
            while True:
                study = client.get(location).json()
                if study["state"] not in ("queued", "running"):
                    break
                sent = time.perf_counter()
                client.post("/api/v1/plans", json=small_plan(index)).raise_for_status()
                latencies.append(time.perf_counter() - sent)
                index += 1
                time.sleep(interval)
            wall = time.perf_counter() - start
            if study["state"] != "succeeded":
                raise SystemExit(f"the study ended {study['state']}: {study['error']}")
            return wall, latencies, study["num_candidates"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="study search pool sizes, comma-separated")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between small plans")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    walls: dict[int, float] = {}
    for workers in (int(w) for w in args.workers.split(",")):
        wall, latencies, candidates = run(workers, args.interval)
        walls[workers] = wall
        ordered = sorted(latencies)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        print(f"{workers} study worker(s): {candidates}-candidate study {wall:.1f} s; {len(latencies)} small "
              f"POST /plans meanwhile: median {statistics.median(latencies) * 1000:.0f} ms, p99 "
              f"{p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms")
    if 1 in walls and len(walls) > 1:
        for workers, wall in walls.items():
            if workers != 1:
                print(f"speed-up at {workers} workers: {walls[1] / wall:.2f}x")


if __name__ == "__main__":
    main()
