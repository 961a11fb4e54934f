"""Benchmark: the HTTP API under load with 10,000 stored plans, on SQLite and PostgreSQL (not a test).

    python bench/api_load.py [--backends sqlite postgresql] [--plans 10000] [--workers 2]
                             [--concurrency 16] [--scenarios ...] [--write]

For each backend: a fresh database (PostgreSQL: a new database on 127.0.0.1:5432, dropped afterwards),
migrated, then bulk-loaded with synthetic plans (one real Plan document, cloned with distinct hashes and
varied headline columns). A real `fsdp-planner serve --workers N` on a loopback port takes the load from
a lean asyncio HTTP/1.1 client with a fixed number of requests in flight. Scenarios: reads (first page,
filtered, deep cursor, one plan), 200 new plans posted at once, duplicates (answered from the stored
hash), and reads of one plan while 8 maximal layer graphs (1,024 units, no two alike: the worst case,
stopped by the search deadline) are searched. Reports requests/s and p50/p99 latency per scenario
against the goals; `--write` puts the table in bench/RESULTS.md under "API load".

Client and server share the machine, so on a 2-core box the numbers are a floor, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from json import dumps, loads
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from sqlalchemy import insert

from api.db import migrate
from api.db.models import PlanRow
from api.db.session import create_db_engine
from api.schemas.plans import PlanCreate
from api.services.plans import build_request
from api.services.search_pool import SearchPool
from planner.search import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.scratch_database import scratch_database

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "## API load (`bench/api_load.py`)"
TEMPLATE = {
    "model": "llama-debug",
    "cluster": "1x2xcpu",
    "training": {"seq_len": 256, "global_batch_tokens": 2048},
}
MODELS = ["llama3-8b", "llama3-70b", "gpt2", "mistral-7b", "llama-debug"]
GPUS = ["H100-SXM-80GB", "A100-80GB", "H200-141GB", "L4"]
GOALS = {  # scenario -> (statistic, bound, unit) from issue 12
    "GET /plans (first page, 50 rows)": ("p99", 200.0, "ms"),
    "POST /plans (duplicate: hash hit)": ("rate", 200.0, "req/s"),
    "GET /plans/{id} while 8 maximal graphs search": ("p99", 200.0, "ms"),
}
SCENARIOS = ("reads", "new", "duplicates", "graphs")


def maximal_graph(variant: int) -> dict:
    """A request for a traced model of 1,024 units, no two alike (nothing to price once)."""
    units = [
        {"name": f"layers.{i}", "num_params": 1_000_000 + 1024 * variant + i, "fwd_flops_per_token": 4e7,
         "activation_bytes_per_token": 4096}
        for i in range(1024)
    ]
    return {
        "model": {"name": f"maximal-{variant}", "architecture": "layer_graph", "layer_graph": units},
        "cluster": "1x8xH100",
        "training": {"seq_len": 2048, "global_batch_tokens": 2048 * 32},
    }


@dataclass
class Result:
    scenario: str
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def seed(url: str, count: int) -> None:
    """Migrate and insert `count` plans in batches (one real document, distinct hashes)."""
    engine = create_db_engine(url)
    migrate.upgrade(engine)
    body = PlanCreate.model_validate(TEMPLATE)
    # A whole-sequence batch: no advice to look for, so the pool is never started.
    request = build_request(body, max_model_layers=1024, search_pool=SearchPool(workers=1, deadline_s=30.0))
    plan = make_plan(request)
    document, request_json = plan.model_dump(mode="json"), request.model_dump(mode="json")
    rng = random.Random(0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(count):
        nodes = rng.choice([1, 2, 4, 8, 16, 32])
        rows.append(
            {
                "name": f"synthetic plan {i}",
                "model_name": rng.choice(MODELS),
                "gpu": rng.choice(GPUS),
                "num_nodes": nodes,
                "gpus_per_node": 8,
                "world_size": nodes * 8,
                "tokens_per_s_per_gpu": rng.uniform(500, 12000),
                "mfu": rng.uniform(0.2, 0.6),
                "peak_memory_gib": rng.uniform(10, 79),
                "step_time_s": rng.uniform(0.5, 20),
                "plan_hash": f"bench{i:059d}",
                "planner_version": plan.planner_version,
                "request": request_json,
                "plan": document,
                "created_at": start + timedelta(seconds=i),
            }
        )
    with engine.begin() as connection:
        for offset in range(0, count, 1000):
            connection.execute(insert(PlanRow), rows[offset : offset + 1000])
    engine.dispose()


@dataclass
class Reply:
    status_code: int
    body: bytes

    def json(self) -> Any:
        return loads(self.body)


class LeanClient:
    """Keep-alive HTTP/1.1 over asyncio streams, the least client work per request: httpx spends
    about as much CPU on a request as the server does, and here client and server share two cores."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Reply:
        target = f"{path}?{urlencode(params)}" if params else path
        return await self._send(f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())

    async def post(self, path: str, json: Any) -> Reply:
        body = dumps(json).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return await self._send(head.encode() + body)

    async def _send(self, request: bytes) -> Reply:
        for attempt in range(2):  # a kept-alive connection the server closed meanwhile: reconnect once
            if self._idle:
                reader, writer = self._idle.pop()
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(request)
            status_line = await reader.readline()
            if not status_line:
                writer.close()
                if attempt == 0:
                    continue
                raise ConnectionError("the server closed the connection")
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            reply = Reply(int(status_line.split()[1]), await reader.readexactly(length))
            self._idle.append((reader, writer))
            return reply
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(url: str, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli.main", "serve", "--port", str(port), "--log-level", "warning",
         "--workers", str(workers)],
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the server did not become ready in 60 s")


async def run(
    client: LeanClient,
    scenario: str,
    count: int,
    concurrency: int,
    make: Callable[[int], Awaitable[Reply]],
    ok: set[int],
) -> Result:
    latencies: list[float] = []
    errors = 0
    next_index = 0

    async def worker() -> None:
        nonlocal next_index, errors
        while next_index < count:
            index = next_index
            next_index += 1
            started = time.perf_counter()
            response = await make(index)
            latencies.append((time.perf_counter() - started) * 1000)
            errors += response.status_code not in ok

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(scenario, count, errors, time.perf_counter() - started, latencies)


async def load(port: int, concurrency: int, requests: int, posts: int, scenarios: set[str]) -> list[Result]:
    rng = random.Random(1)
    client = LeanClient("127.0.0.1", port)
    try:
        ids = [
            item["id"] for item in (await client.get("/api/v1/plans", params={"limit": 200})).json()["items"]
        ]
        cursors: list[str] = []
        page = (await client.get("/api/v1/plans", params={"sort": "mfu", "limit": 50})).json()
        for _ in range(40):  # cursors up to 2,000 rows deep
            if page["next_cursor"] is None:
                break
            cursors.append(page["next_cursor"])
            page = (
                await client.get(
                    "/api/v1/plans", params={"sort": "mfu", "limit": 50, "cursor": page["next_cursor"]}
                )
            ).json()

        async def first_page(_: int) -> Reply:
            return await client.get("/api/v1/plans", params={"limit": 50})

        async def filtered(_: int) -> Reply:
            params = {
                "limit": 50,
                "model": rng.choice(MODELS),
                "gpu": rng.choice(GPUS),
                "sort": rng.choice(["tokens_per_s_per_gpu", "peak_memory_gib", "created_at"]),
            }
            return await client.get("/api/v1/plans", params=params)

        async def deep_page(_: int) -> Reply:
            return await client.get(
                "/api/v1/plans", params={"sort": "mfu", "limit": 50, "cursor": rng.choice(cursors)}
            )

        async def one_plan(_: int) -> Reply:
            return await client.get(f"/api/v1/plans/{rng.choice(ids)}")

        async def new_plan(index: int) -> Reply:
            seq_len = (64, 128, 256, 512)[index % 4]
            body = {
                **TEMPLATE,
                "training": {"seq_len": seq_len, "global_batch_tokens": seq_len * 2 * (index // 4 + 100)},
            }
            return await client.post("/api/v1/plans", json=body)

        async def duplicate_plan(_: int) -> Reply:
            return await client.post("/api/v1/plans", json=TEMPLATE)

        results: list[Result] = []
        if "reads" in scenarios:
            for scenario, make in (
                ("GET /plans (first page, 50 rows)", first_page),
                ("GET /plans (filter + sort)", filtered),
                ("GET /plans (cursor, up to 2,000 deep)", deep_page),
                ("GET /plans/{id} (whole document)", one_plan),
            ):
                results.append(await run(client, scenario, requests, concurrency, make, {200}))
        if "new" in scenarios:  # all at once: as many in flight as there are new plans
            scenario = f"POST /plans ({posts} new at once)"
            results.append(await run(client, scenario, posts, posts, new_plan, {201}))
        if "duplicates" in scenarios:
            await client.post("/api/v1/plans", json=TEMPLATE)  # stored once; the duplicates find it
            scenario = "POST /plans (duplicate: hash hit)"
            results.append(await run(client, scenario, requests, concurrency, duplicate_plan, {200}))
        if "graphs" in scenarios:
            results += await reads_during_graphs(client, one_plan)
        return results
    finally:
        await client.aclose()


async def reads_during_graphs(
    client: LeanClient, one_plan: Callable[[int], Awaitable[Reply]]
) -> list[Result]:
    """Read single plans (4 in flight) for as long as 8 maximal layer graphs are being planned."""
    started = time.perf_counter()
    graph_latencies: list[float] = []

    async def post_graph(variant: int) -> Reply:
        sent = time.perf_counter()
        response = await client.post("/api/v1/plans", json=maximal_graph(variant))
        graph_latencies.append((time.perf_counter() - sent) * 1000)
        return response

    graphs = asyncio.gather(*(post_graph(v) for v in range(8)))
    await asyncio.sleep(1.0)  # the searches are under way
    reads = Result("GET /plans/{id} while 8 maximal graphs search", 0, 0, 0.0, [])
    read_started = time.perf_counter()

    async def reader() -> None:
        while not graphs.done():
            sent = time.perf_counter()
            response = await one_plan(0)
            reads.latencies_ms.append((time.perf_counter() - sent) * 1000)
            reads.requests += 1
            reads.errors += response.status_code != 200
            await asyncio.sleep(0.01)  # a steady trickle of readers, not a flood

    await asyncio.gather(*(reader() for _ in range(4)))
    responses = await graphs
    reads.seconds = time.perf_counter() - read_started
    statuses = sorted(r.status_code for r in responses)
    searched = Result(
        f"POST 8 maximal layer graphs at once (answered {', '.join(map(str, statuses))})",
        8, sum(s not in (201, 422) for s in statuses), time.perf_counter() - started, graph_latencies,
    )
    return [reads, searched]


def verdict(result: Result) -> str:
    goal = GOALS.get(result.scenario)
    if goal is None:
        return ""
    statistic, bound, unit = goal
    if statistic == "rate":
        return f"{'met' if result.rate >= bound else 'MISSED'} (>= {bound:.0f} {unit})"
    return f"{'met' if result.percentile(0.99) < bound else 'MISSED'} (p99 < {bound:.0f} {unit})"


def table(results: dict[str, list[Result]], plans: int, concurrency: int, workers: int) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: 2-core x86_64 container, no GPU, CPython {platform.python_version()}; measured "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC (load average {os.getloadavg()[0]:.1f} at the end: other "
        f"work shared the cores). {plans:,} stored plans, `fsdp-planner serve --workers {workers}` on "
        f"loopback (the web processes share the cores among their pools of search processes), {concurrency} "
        "requests in flight from one lean asyncio client on the same two cores unless the scenario says "
        "otherwise.",
        "",
        "| database | scenario | requests | errors | req/s | p50 ms | p99 ms | goal |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for backend, rows in results.items():
        for r in rows:
            lines.append(
                f"| {backend} | {r.scenario} | {r.requests:,} | {r.errors} | {r.rate:,.0f} | "
                f"{r.percentile(0.50):.1f} | {r.percentile(0.99):.1f} | {verdict(r)} |"
            )
    return "\n".join(lines) + "\n"


def write_section(markdown: str) -> None:
    """Replace this benchmark's section of RESULTS.md (or append it), leaving the others alone."""
    existing = RESULTS.read_text() if RESULTS.exists() else ""
    start = existing.find(SECTION)
    if start < 0:
        RESULTS.write_text(existing.rstrip("\n") + ("\n\n" if existing else "") + markdown)
        return
    end = existing.find("\n## ", start + len(SECTION))
    rest = existing[end + 1 :] if end >= 0 else ""
    RESULTS.write_text(existing[:start] + markdown + ("\n" + rest if rest else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite"], choices=["sqlite", "postgresql"])
    parser.add_argument("--plans", type=int, default=10_000, help="plans stored before the load")
    parser.add_argument("--requests", type=int, default=2000, help="requests per read/duplicate scenario")
    parser.add_argument("--posts", type=int, default=200, help="new plans posted at once (each searches)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="web processes (`serve --workers`)")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()

    results: dict[str, list[Result]] = {}
    for backend in args.backends:
        with scratch_database(backend) as url:
            started = time.perf_counter()
            seed(url, args.plans)
            print(f"{backend}: seeded {args.plans:,} plans in {time.perf_counter() - started:.1f} s")
            port = free_port()
            server = start_server(url, port, args.workers)
            try:
                results[backend] = asyncio.run(
                    load(port, args.concurrency, args.requests, args.posts, set(args.scenarios))
                )
            finally:
                server.terminate()
                server.wait(timeout=30)
        for r in results[backend]:
            print(
                f"  {r.scenario:40s} {r.rate:8.0f} req/s  p50 {r.percentile(0.5):7.1f} ms  "
                f"p99 {r.percentile(0.99):7.1f} ms  errors {r.errors}  {verdict(r)}", flush=True
            )
    markdown = table(results, args.plans, args.concurrency, args.workers)
    if args.write:
        write_section(markdown)
        print(f"wrote {RESULTS}")
    else:
        print(markdown)


if __name__ == "__main__":
    main()
