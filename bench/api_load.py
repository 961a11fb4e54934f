"""Benchmark: the HTTP API under load with 10,000 stored plans, on SQLite and PostgreSQL (not a test).

    python bench/api_load.py [--backends sqlite postgresql] [--plans 10000] [--concurrency 16] [--write]

For each backend: a fresh database (PostgreSQL: a new database on 127.0.0.1:5432, dropped afterwards),
migrated, then bulk-loaded with synthetic plans (one real Plan document, cloned with distinct hashes and
varied headline columns). A real `fsdp-planner serve` process on a loopback port takes the load from an
asyncio httpx client with a fixed number of requests in flight. Reports requests/s and p50/p99 latency
per scenario; `--write` puts the table in bench/RESULTS.md under "API load".

Client and server share the machine, so on a 2-core box the numbers are a floor, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from api.db import migrate
from api.db.models import PlanRow
from api.db.session import create_db_engine
from api.schemas.plans import PlanCreate
from api.services.plans import build_request
from planner.search import make_plan

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "## API load (`bench/api_load.py`)"
PG_ADMIN_URL = os.environ.get(
    "FSDP_PLANNER_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
TEMPLATE = {
    "model": "llama-debug",
    "cluster": "1x2xcpu",
    "training": {"seq_len": 256, "global_batch_tokens": 2048},
}
MODELS = ["llama3-8b", "llama3-70b", "gpt2", "mistral-7b", "llama-debug"]
GPUS = ["H100-SXM-80GB", "A100-80GB", "H200-141GB", "L4"]


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
    request = build_request(body, max_model_layers=1024)
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli.main", "serve", "--port", str(port), "--log-level", "warning"],
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
    client: httpx.AsyncClient,
    scenario: str,
    count: int,
    concurrency: int,
    make: Callable[[int], Awaitable[httpx.Response]],
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


async def load(base: str, concurrency: int, requests: int, posts: int) -> list[Result]:
    rng = random.Random(1)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
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

        async def first_page(_: int) -> httpx.Response:
            return await client.get("/api/v1/plans", params={"limit": 50})

        async def filtered(_: int) -> httpx.Response:
            params = {
                "limit": 50,
                "model": rng.choice(MODELS),
                "gpu": rng.choice(GPUS),
                "sort": rng.choice(["tokens_per_s_per_gpu", "peak_memory_gib", "created_at"]),
            }
            return await client.get("/api/v1/plans", params=params)

        async def deep_page(_: int) -> httpx.Response:
            return await client.get(
                "/api/v1/plans", params={"sort": "mfu", "limit": 50, "cursor": rng.choice(cursors)}
            )

        async def one_plan(_: int) -> httpx.Response:
            return await client.get(f"/api/v1/plans/{rng.choice(ids)}")

        async def new_plan(index: int) -> httpx.Response:
            seq_len = (64, 128, 256, 512)[index % 4]
            body = {
                **TEMPLATE,
                "training": {"seq_len": seq_len, "global_batch_tokens": seq_len * 2 * (index // 4 + 100)},
            }
            return await client.post("/api/v1/plans", json=body)

        async def duplicate_plan(_: int) -> httpx.Response:
            return await client.post("/api/v1/plans", json=TEMPLATE)

        await client.post("/api/v1/plans", json=TEMPLATE)  # stored once; the duplicates find it
        return [
            await run(client, "GET /plans (first page, 50 rows)", requests, concurrency, first_page, {200}),
            await run(client, "GET /plans (filter + sort)", requests, concurrency, filtered, {200}),
            await run(
                client, "GET /plans (cursor, up to 2,000 deep)", requests, concurrency, deep_page, {200}
            ),
            await run(client, "GET /plans/{id} (whole document)", requests, concurrency, one_plan, {200}),
            await run(client, "POST /plans (new: runs the search)", posts, concurrency, new_plan, {201}),
            await run(
                client, "POST /plans (duplicate: hash hit)", requests, concurrency, duplicate_plan, {200}
            ),
        ]


def database_for(backend: str, workdir: Path) -> tuple[str, Callable[[], None]]:
    if backend == "sqlite":
        return f"sqlite:///{workdir / 'bench.sqlite3'}", lambda: None
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fsdp_planner_bench_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False), drop


def table(results: dict[str, list[Result]], plans: int, concurrency: int) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: 2-core x86_64 container, no GPU, CPython {platform.python_version()}; measured "
        f"{datetime.now(UTC):%Y-%m-%d} (load average {os.getloadavg()[0]:.1f} at the end: other work shared "
        f"the cores). {plans:,} stored plans, one `fsdp-planner serve` process (uvicorn, "
        f"1 worker) on loopback, {concurrency} requests in flight from an httpx client on the same two "
        "cores.",
        "",
        "| database | scenario | requests | errors | req/s | p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for backend, rows in results.items():
        for r in rows:
            lines.append(
                f"| {backend} | {r.scenario} | {r.requests:,} | {r.errors} | {r.rate:,.0f} | "
                f"{r.percentile(0.50):.1f} | {r.percentile(0.99):.1f} |"
            )
    lines += [
        "",
        "New plans are bound by the CPU-bound search (llama-debug on 1x2xcpu, ~0.1 s of CPU each) running "
        "in the worker threads; duplicates are answered from the input hash without searching.",
    ]
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
    parser.add_argument(
        "--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    parser.add_argument("--plans", type=int, default=10_000, help="plans stored before the load")
    parser.add_argument("--requests", type=int, default=2000, help="requests per read/duplicate scenario")
    parser.add_argument("--posts", type=int, default=200, help="new plans (each runs a search)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()

    results: dict[str, list[Result]] = {}
    for backend in args.backends:
        with tempfile.TemporaryDirectory() as workdir:
            url, drop = database_for(backend, Path(workdir))
            try:
                started = time.perf_counter()
                seed(url, args.plans)
                print(f"{backend}: seeded {args.plans:,} plans in {time.perf_counter() - started:.1f} s")
                port = free_port()
                server = start_server(url, port)
                try:
                    results[backend] = asyncio.run(
                        load(f"http://127.0.0.1:{port}", args.concurrency, args.requests, args.posts)
                    )
                finally:
                    server.terminate()
                    server.wait(timeout=30)
            finally:
                drop()
        for r in results[backend]:
            print(
                f"  {r.scenario:40s} {r.rate:8.0f} req/s  p50 {r.percentile(0.5):7.1f} ms  "
                f"p99 {r.percentile(0.99):7.1f} ms  errors {r.errors}"
            )
    markdown = table(results, args.plans, args.concurrency)
    if args.write:
        write_section(markdown)
        print(f"wrote {RESULTS}")
    else:
        print(markdown)


if __name__ == "__main__":
    main()
