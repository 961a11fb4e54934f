"""Benchmark: reads stay fast while hostile plan requests arrive (not a test; run on demand).

    python bench/hostile_requests.py [--hostile 20] [--reads 400]

Starts `fsdp-planner serve` on an empty SQLite database, stores a few plans, then sends `--hostile`
POST /api/v1/plans at once whose cluster string asks for 99,999,999,999,999 GPUs per node (the request
that once searched forever in a web thread) while one client reads `GET /api/v1/plans` `--reads`
times. Reports each hostile answer's status and time, and the reads' median and 99th percentile.
Goals: every hostile request answered (4xx) in under 1 s; reads' median under 50 ms.
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
import tempfile
import time
from pathlib import Path

import httpx

HOSTILE = {
    "model": "llama-debug",
    "cluster": "1x99999999999999xcpu",
    "training": {"seq_len": 256, "global_batch_tokens": 1024},
}
CHEAP = {
    "model": "llama-debug", "cluster": "1x2xcpu", "training": {"seq_len": 256, "global_batch_tokens": 1024}
}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _measure(url: str, hostile: int, reads: int) -> tuple[list[tuple[int, float]], list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for name in ("a", "b", "c"):
            await client.post("/api/v1/plans", json={**CHEAP, "name": name})

        async def attack() -> tuple[int, float]:
            start = time.perf_counter()
            response = await client.post("/api/v1/plans", json=HOSTILE)
            return response.status_code, time.perf_counter() - start

        async def read_all() -> list[float]:
            times = []
            for _ in range(reads):
                start = time.perf_counter()
                (await client.get("/api/v1/plans")).raise_for_status()
                times.append(time.perf_counter() - start)
            return times

        results = await asyncio.gather(read_all(), *(attack() for _ in range(hostile)))
        return list(results[1:]), results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostile", type=int, default=20)
    parser.add_argument("--reads", type=int, default=400)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    port = _port()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'bench.db'}"}
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
        attacks, reads = asyncio.run(_measure(url, args.hostile, args.reads))
    finally:
        server.terminate()
        server.wait(timeout=10)
    statuses = sorted({status for status, _ in attacks})
    slowest = max(seconds for _, seconds in attacks)
    reads_ms = sorted(1000 * s for s in reads)
    median, p99 = statistics.median(reads_ms), reads_ms[int(0.99 * (len(reads_ms) - 1))]
    print(f"{platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}")
    print("| hostile POSTs | statuses | slowest answer | GET /plans | median ms | p99 ms | goals |")
    print("|---:|---|---:|---:|---:|---:|---|")
    met = slowest < 1.0 and median < 50.0 and all(400 <= s < 500 for s in statuses)
    print(f"| {len(attacks)} | {', '.join(map(str, statuses))} | {slowest * 1000:.0f} ms | {len(reads)} "
          f"| {median:.1f} | {p99:.1f} | {'met' if met else 'MISSED'} |")


if __name__ == "__main__":
    main()
