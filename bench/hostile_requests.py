"""Benchmark: reads and other clients' small plans stay fast while hostile requests arrive (not a test;
run on demand).

    python bench/hostile_requests.py [--backends sqlite postgresql] [--engines in-process procrastinate]
                                     [--kinds cluster advice lists shardings space hint] [--keys]
                                     [--hostile 10] [--reads 400] [--read-interval-ms 10]

For each backend, job engine (procrastinate: PostgreSQL only, with one `fsdp-planner worker`) and kind
of hostile request, starts `fsdp-planner serve` (its default settings: a search pool of one process per
core, 30 s of CPU per plan, each client's share of the pool half of it) on an empty database (PostgreSQL:
a new database on FSDP_PLANNER_BENCH_POSTGRES_URL's server, default 127.0.0.1:5432, dropped afterwards),
stores a few plans, then sends `--hostile` hostile requests at once from one client (address 127.0.0.2;
with `--keys`, the server has API keys and the hostile client sends its own), while two other clients
(address 127.0.0.1, with `--keys` another key) measure until every hostile request is answered:

- reads: `GET /api/v1/plans` over and over, `--read-interval-ms` apart (at least `--reads` times);
- small plans: `POST /api/v1/plans` of llama-debug on 1x2xcpu, each a new batch (a real search, not the
  stored plan), 50 ms apart (at least 40 of them).

Kinds of hostile request:

- `cluster`: a cluster string asking for 99,999,999,999,999 GPUs per node (issue 22). Refused (422) < 1 s.
- `advice`: llama3.1-405b on 1x8xH100 at seq_len 1048576 with a batch of 3145729 tokens, not whole
  sequences: refused with advice that probes configurations for about 6 s of CPU in the search pool.
- `lists`: llama-debug on 1x2xcpu with `search.compile` of 10,000 entries (issue 38, item 6: it priced
  1.9 million configurations for 93 s). Refused as read (422: at most 16 entries).
- `shardings`: the same with 1,000 `search.shardings` (it took 10.6 s). Refused as read (422).
- `space`: llama2-7b on 4096x64xH100 at seq 32768, batch 2^36 tokens, three Float8 recipes: a search
  space of about 2 million configurations. Refused before pricing (422 search-space-too-large).
- `hint`: the dashboard's `POST /plans/new/batch-hint` for llama3.1-405b at seq_len 1048576 on 1x8xH100
  with a partial batch (issue 38, item 7: 31 s of search without a key). With `--keys` and no key:
  refused (401); otherwise one at a time in the client's share, the others 429 past the wait.

Goals: no hostile request answered >= 500; reads' median under 50 ms and none over 1 s; the small plans'
99th percentile under 1 s (issue 38: two hostile requests once made a small plan wait 74-154 s);
`cluster`, `lists`, `shardings` and `space` each answered in under 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.scratch_database import scratch_database


@dataclass(frozen=True)
class Hostile:
    """One kind of hostile request: what it posts where, and whether it must be answered at once."""

    path: str
    json: dict[str, Any] | None = None
    form: dict[str, str] | None = None
    answered_within_s: float | None = None


_DEBUG = {"model": "llama-debug", "cluster": "1x2xcpu",
          "training": {"seq_len": 256, "global_batch_tokens": 1024}}
HOSTILE: dict[str, Hostile] = {
    "cluster": Hostile("/api/v1/plans", json={
        "model": "llama-debug", "cluster": "1x99999999999999xcpu",
        "training": {"seq_len": 256, "global_batch_tokens": 1024},
    }, answered_within_s=1.0),
    "advice": Hostile("/api/v1/plans", json={
        "model": "llama3.1-405b", "cluster": "1x8xH100",
        "training": {"seq_len": 1048576, "global_batch_tokens": 3145729},
    }),
    "lists": Hostile("/api/v1/plans", json={**_DEBUG, "search": {"compile": [True, False] * 5000}},
                     answered_within_s=1.0),
    "shardings": Hostile("/api/v1/plans", json={
        **_DEBUG, "search": {"shardings": ["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] * 250},
    }, answered_within_s=1.0),
    "space": Hostile("/api/v1/plans", json={
        "model": "llama2-7b", "cluster": "4096x64xH100",
        "training": {"seq_len": 32768, "global_batch_tokens": 2**36},
        "search": {"float8": ["none", "tensorwise", "rowwise"]},
    }, answered_within_s=1.0),
    "hint": Hostile("/plans/new/batch-hint", form={
        "model": "llama3.1-405b", "num_nodes": "1", "gpus_per_node": "8", "gpu": "H100-SXM-80GB",
        "seq_len": "1048576", "global_batch_tokens": "3145729", "precision": "bf16", "optimizer": "adamw",
    }),
}
HOSTILE_ADDRESS, OWN_ADDRESS = "127.0.0.2", "127.0.0.1"
SMALL_INTERVAL_S = 0.05
MIN_SMALL_PLANS = 40
"""Small plans measured at least (hostile requests refused at once leave no more time than that)."""
SETTLE_S = 3.0
"""Waited after the server (and the worker) answer, before measuring: their search processes start."""
SAME_ORIGIN_FORM = {"Sec-Fetch-Site": "same-origin"}
"""What a browser sends with the dashboard's own script's request (another site's would be refused)."""


def small_plan(index: int) -> dict[str, Any]:
    """A cheap request that no earlier one matches (so it searches rather than hits the stored plan)."""
    return {**_DEBUG, "training": {"seq_len": 128, "global_batch_tokens": 256 * (index + 1)}}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command() -> list[str]:
    return [sys.executable, "-m", "api.cli.main"]


@dataclass
class Measured:
    hostile: list[tuple[int, float]]
    reads: list[float]
    small: list[tuple[int, float]]


async def _measure(url: str, kind: Hostile, hostile: int, reads: int, interval_s: float,
                   keys: dict[str, str]) -> Measured:
    own_auth = {"Authorization": f"Bearer {keys['user']}"} if keys else {}
    attacker_auth = {"Authorization": f"Bearer {keys['attacker']}"} if "attacker" in keys else {}
    attacker_transport = httpx.AsyncHTTPTransport(local_address=HOSTILE_ADDRESS)
    async with httpx.AsyncClient(base_url=url, timeout=300, headers=own_auth) as own, \
            httpx.AsyncClient(base_url=url, timeout=300, transport=attacker_transport) as attacker:
        for name in ("a", "b", "c"):
            (await own.post("/api/v1/plans", json={**_DEBUG, "name": name})).raise_for_status()

        async def attack() -> tuple[int, float]:
            start = time.perf_counter()
            if kind.form is not None:
                form = {**kind.form, **({"api_key": keys["attacker"]} if "attacker" in keys else {})}
                response = await attacker.post(kind.path, data=form, headers=SAME_ORIGIN_FORM)
            else:
                response = await attacker.post(kind.path, json=kind.json, headers=attacker_auth)
            return response.status_code, time.perf_counter() - start

        attacks = [asyncio.ensure_future(attack()) for _ in range(hostile)]

        async def read_loop() -> list[float]:
            times: list[float] = []
            while len(times) < reads or not all(a.done() for a in attacks):
                start = time.perf_counter()
                (await own.get("/api/v1/plans")).raise_for_status()
                times.append(time.perf_counter() - start)
                await asyncio.sleep(interval_s)
            return times

        async def small_loop() -> list[tuple[int, float]]:
            answers: list[tuple[int, float]] = []
            for index in itertools.count():
                if all(a.done() for a in attacks) and len(answers) >= MIN_SMALL_PLANS:
                    return answers
                start = time.perf_counter()
                response = await own.post("/api/v1/plans", json=small_plan(index))
                answers.append((response.status_code, time.perf_counter() - start))
                await asyncio.sleep(SMALL_INTERVAL_S)
            raise AssertionError("unreachable")

        await asyncio.sleep(0.2)  # the hostile requests reach the server first
        read_times, small = await asyncio.gather(read_loop(), small_loop())
        return Measured([await a for a in attacks], read_times, small)


def _create_keys(env: dict[str, str], names: list[str]) -> dict[str, str]:
    """API keys created with the CLI (the database is migrated by then): name -> key."""
    created = {}
    for name in names:
        output = subprocess.run([*_command(), "keys", "create", name], env=env, check=True,
                                capture_output=True, text=True).stdout
        created[name] = next(word for word in output.split() if word.startswith("fsdpk_"))
    return created


def _run(backend: str, engine: str, kind: str, args: argparse.Namespace) -> str:
    with scratch_database(backend) as database_url:
        return _against(database_url, backend, engine, kind, args)


def _against(database_url: str, backend: str, engine: str, kind: str, args: argparse.Namespace) -> str:
    port = _port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("FSDP_PLANNER_") and key != "DATABASE_URL"}
    env.update(DATABASE_URL=database_url, FSDP_PLANNER_JOB_ENGINE=engine)
    logs = Path(tempfile.mkdtemp())
    processes = [subprocess.Popen(
        [*_command(), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=(logs / "serve.log").open("wb"), stderr=subprocess.STDOUT,
    )]
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        if engine == "procrastinate":
            worker_log = logs / "worker.log"
            processes.append(subprocess.Popen([*_command(), "worker", "--name", "bench"], env=env,
                                              stdout=worker_log.open("wb"), stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 120
            while "Starting worker on queues" not in worker_log.read_text(errors="replace"):
                if processes[-1].poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the worker did not start:\n{worker_log.read_text(errors='replace')}")
                time.sleep(0.1)
        time.sleep(SETTLE_S)  # the worker's search pool is forked from a process that imports the planner
        names = (["user", "attacker"] if args.hostile_key else ["user"]) if args.keys else []
        keys = _create_keys(env, names)
        measured = asyncio.run(_measure(url, HOSTILE[kind], args.hostile, args.reads,
                                        args.read_interval_ms / 1000, keys))
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
    return _row(backend, engine, kind, args, measured)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _row(backend: str, engine: str, kind: str, args: argparse.Namespace, m: Measured) -> str:
    statuses = sorted({status for status, _ in m.hostile})
    counts = ", ".join(f"{sum(1 for s, _ in m.hostile if s == status)} x {status}" for status in statuses)
    slowest = max(seconds for _, seconds in m.hostile)
    reads_ms = [1000 * s for s in m.reads]
    small_ms = [1000 * s for _, s in m.small]
    small_statuses = sorted({status for status, _ in m.small})
    limit = HOSTILE[kind].answered_within_s
    met = (all(s < 500 for s in statuses) and statistics.median(reads_ms) < 50.0 and max(reads_ms) < 1000.0
           and _percentile(small_ms, 0.99) < 1000.0 and small_statuses == [201]
           and (limit is None or slowest < limit))
    client = ("key" if args.hostile_key else "no key") if args.keys else "anonymous"
    return (f"| {backend} | {engine} | {kind} | {client} | {counts} | {slowest:.2f} s | {len(m.reads)} "
            f"| {statistics.median(reads_ms):.1f} | {max(reads_ms):.1f} | {len(m.small)} "
            f"({', '.join(map(str, small_statuses))}) | {statistics.median(small_ms):.0f} "
            f"| {_percentile(small_ms, 0.99):.0f} | {max(small_ms):.0f} | {'met' if met else 'MISSED'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite"], choices=["sqlite", "postgresql"])
    parser.add_argument("--engines", nargs="+", default=["in-process"],
                        choices=["in-process", "procrastinate"])
    parser.add_argument("--kinds", nargs="+", default=list(HOSTILE), choices=list(HOSTILE))
    parser.add_argument("--keys", action="store_true",
                        help="the server has API keys; the measuring clients send one")
    parser.add_argument("--hostile-key", action="store_true",
                        help="with --keys: the hostile client sends a valid key of its own (else none)")
    parser.add_argument("--hostile", type=int, default=10)
    parser.add_argument("--reads", type=int, default=400)
    parser.add_argument("--read-interval-ms", type=float, default=10.0)
    args = parser.parse_args()
    rows = [_run(backend, engine, kind, args) for backend in args.backends for engine in args.engines
            if not (engine == "procrastinate" and backend == "sqlite") for kind in args.kinds]
    print(f"{platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}")
    print("| database | engine | hostile | its client | answers | slowest | GET /plans | median ms | max ms "
          "| small POSTs | median ms | p99 ms | max ms | goals |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
