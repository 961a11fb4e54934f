"""Benchmark: reads stay fast while hostile plan requests arrive (not a test; run on demand).

    python bench/hostile_requests.py [--backends sqlite postgresql] [--kinds cluster advice]
                                     [--hostile 20] [--reads 400] [--read-interval-ms 10]

For each backend (PostgreSQL: a new database on FSDP_PLANNER_BENCH_POSTGRES_URL's server, default
127.0.0.1:5432, dropped afterwards) and each kind of hostile request, starts `fsdp-planner serve` (its
default settings: a search pool of one process per core, 30 s of CPU per plan) on an empty database,
stores a few plans, then sends `--hostile` POST /api/v1/plans at once while one client reads
`GET /api/v1/plans` over and over, `--read-interval-ms` apart (at least `--reads` times, and until every
hostile request is answered):

- `cluster`: a cluster string asking for 99,999,999,999,999 GPUs per node (the request that once searched
  forever in a web thread). Goal: each answered (4xx) in under 1 s.
- `advice`: llama3.1-405b on 1x8xH100 at seq_len 1048576 with a batch of 3145729 tokens, not whole
  sequences: refused with advice (batches and clusters that plan), which probes configurations for
  about 4 s of CPU. That advice once ran in a web thread; it runs in the search pool now, so the
  answers queue behind the pool's processes, and the goal is for the reads alone.

Reports each kind's statuses and slowest answer, and the reads' median, 99th percentile and maximum.
Goals for every kind: each hostile request refused (4xx); reads' median under 50 ms and none over 1 s
(a web thread that searched made reads wait seconds now and then, which a median does not show).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.scratch_database import scratch_database

HOSTILE: dict[str, dict[str, Any]] = {
    "cluster": {
        "model": "llama-debug",
        "cluster": "1x99999999999999xcpu",
        "training": {"seq_len": 256, "global_batch_tokens": 1024},
    },
    "advice": {
        "model": "llama3.1-405b",
        "cluster": "1x8xH100",
        "training": {"seq_len": 1048576, "global_batch_tokens": 3145729},
    },
}
CHEAP = {
    "model": "llama-debug", "cluster": "1x2xcpu", "training": {"seq_len": 256, "global_batch_tokens": 1024}
}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _measure(
    url: str, body: dict[str, Any], hostile: int, reads: int, interval_s: float
) -> tuple[list[tuple[int, float]], list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for name in ("a", "b", "c"):
            await client.post("/api/v1/plans", json={**CHEAP, "name": name})

        async def attack() -> tuple[int, float]:
            start = time.perf_counter()
            response = await client.post("/api/v1/plans", json=body)
            return response.status_code, time.perf_counter() - start

        attacks = [asyncio.ensure_future(attack()) for _ in range(hostile)]
        times = []
        while len(times) < reads or not all(a.done() for a in attacks):
            start = time.perf_counter()
            (await client.get("/api/v1/plans")).raise_for_status()
            times.append(time.perf_counter() - start)
            await asyncio.sleep(interval_s)
        return [await a for a in attacks], times


def _run(backend: str, kind: str, hostile: int, reads: int, interval_s: float) -> str:
    with scratch_database(backend) as database_url:
        return _against(database_url, backend, kind, hostile, reads, interval_s)


def _against(database_url: str, backend: str, kind: str, hostile: int, reads: int, interval_s: float) -> str:
    port = _port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("FSDP_PLANNER_") and key != "DATABASE_URL"}
    env["DATABASE_URL"] = database_url
    server = subprocess.Popen(
        [sys.executable, "-m", "api.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        attacks, times = asyncio.run(_measure(url, HOSTILE[kind], hostile, reads, interval_s))
    finally:
        server.terminate()
        server.wait(timeout=30)
    statuses = sorted({status for status, _ in attacks})
    slowest = max(seconds for _, seconds in attacks)
    reads_ms = sorted(1000 * s for s in times)
    median, p99 = statistics.median(reads_ms), reads_ms[int(0.99 * (len(reads_ms) - 1))]
    refused = all(400 <= s < 500 for s in statuses)
    met = refused and median < 50.0 and reads_ms[-1] < 1000.0 and (kind != "cluster" or slowest < 1.0)
    return (f"| {backend} | {kind} | {len(attacks)} | {', '.join(map(str, statuses))} | {slowest:.2f} s "
            f"| {len(times)} | {median:.1f} | {p99:.1f} | {reads_ms[-1]:.1f} "
            f"| {'met' if met else 'MISSED'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite"], choices=["sqlite", "postgresql"])
    parser.add_argument("--kinds", nargs="+", default=list(HOSTILE), choices=list(HOSTILE))
    parser.add_argument("--hostile", type=int, default=20)
    parser.add_argument("--reads", type=int, default=400)
    parser.add_argument("--read-interval-ms", type=float, default=10.0)
    args = parser.parse_args()
    rows = [_run(backend, kind, args.hostile, args.reads, args.read_interval_ms / 1000)
            for backend in args.backends for kind in args.kinds]
    print(f"{platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}")
    print("| database | hostile | POSTs | statuses | slowest answer | GET /plans | median ms | p99 ms "
          "| max ms | goals |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
