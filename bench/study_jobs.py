"""Benchmark: studies as jobs through the API, and small plans beside them (not a test; run on demand).

    python bench/study_jobs.py [--engine in-process|procrastinate] [--workers 1,2] [--worker-processes 1]
                               [--study issue25|405b] [--studies 1] [--interval 0.25 | --no-small-plans]

Starts `fsdp-planner serve` on an empty database once per combination of `--workers` (the study search
pool's size of each process that runs studies, FSDP_PLANNER_STUDY_SEARCH_WORKERS) and `--worker-processes`,
submits `--studies` studies at the same moment (`POST /api/v1/studies` -> 202) and polls each
(`GET /api/v1/studies/{id}`) until it has succeeded; meanwhile one client sends small `POST /api/v1/plans`
one after another (each a new request, so each searches) every `--interval` seconds, unless
`--no-small-plans` (then the studies alone, polled every 50 ms).

Engines: `in-process` (SQLite, the web process runs the studies, one at a time by default) and
`procrastinate` (a fresh PostgreSQL database on FSDP_PLANNER_TEST_POSTGRES_URL's server, default
postgresql+psycopg://postgres@127.0.0.1:5432/postgres, FSDP_PLANNER_JOB_ENGINE=procrastinate, and
`--worker-processes` `fsdp-planner worker` processes, each running one study at a time in its own search
pool of `--workers` processes, as one machine each would).

Studies: `issue25` is issue 25's maximal study (llama3-8b, 256 candidates: H100 and A100 clusters of 16 to
2,048 GPUs in steps of 16); `405b` is issue 15's (llama3.1-405b on H100, H200 and A100 x 10 sizes, 8 to
4,096 GPUs, doubling; bench/study_latency.py times its searches without the API). Each of several
studies gets its own token budget, so none is a replay of another.

Reports each study's wall time (submit to succeeded, as its client sees it), the wall time of all of
them, and the small plans' latency: median, 99th percentile, max. Goals (issue 25): small plans' p99 <= 1 s
(it was 74.8 s when a study ran inside its request); the 256-candidate study from 1 to 2 search workers
>= 1.7x on a 2-core machine; the 405B study < 10 s end to end.
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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.scratch_database import scratch_database

STUDY = {
    "model": "llama3-8b", "token_budget": 15 * 10**12, "gpus": [{"gpu": "H100"}, {"gpu": "A100"}],
    "cluster_sizes": {"min_gpus": 16, "max_gpus": 2048, "progression": "step", "step": 16},
    "seq_len": 8192, "global_batch_tokens": 4 * 2**20,
}
STUDY_405B = {
    "model": "llama3.1-405b", "token_budget": 15 * 10**12,
    "gpus": [{"gpu": "H100"}, {"gpu": "H200"}, {"gpu": "A100"}],
    "cluster_sizes": {"min_gpus": 8, "max_gpus": 4096}, "seq_len": 8192, "global_batch_tokens": 16 * 2**20,
    "deadline_days": 400.0,
}
STUDIES = {"issue25": STUDY, "405b": STUDY_405B}


def small_plan(index: int) -> dict[str, object]:
    """A cheap request that no earlier one matches (so it searches rather than hits the stored plan)."""
    return {"model": "llama-debug", "cluster": "1x2xcpu",
            "training": {"seq_len": 256, "global_batch_tokens": 512 * (index + 1)}}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command() -> list[str]:
    return [sys.executable, "-m", "api.cli.main"]


def _start_worker(env: dict[str, str], log: Path, name: str) -> subprocess.Popen[bytes]:
    """A `fsdp-planner worker`, returned once it listens on its queues."""
    process = subprocess.Popen([*_command(), "worker", "--name", name], env=env, stdout=log.open("wb"),
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "Starting worker on queues studies" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker {name} did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    return process


def run(workers: int, interval: float | None, *, engine: str = "in-process", worker_processes: int = 1,
        study: dict[str, Any] = STUDY, studies: int = 1) -> dict[str, Any]:
    """Submit `studies` copies of `study` at once with a study search pool of `workers` per process that
    runs studies: their wall times (submit to succeeded), the wall time of all, the small plans'
    latencies (none when `interval` is None), and the candidates per study."""
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database("sqlite" if engine == "in-process" else "postgresql"))
        logs = Path(tempfile.mkdtemp())
        port = _port()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("FSDP_PLANNER_") and key != "DATABASE_URL"}
        env.update(DATABASE_URL=url, FSDP_PLANNER_JOB_ENGINE=engine,
                   FSDP_PLANNER_STUDY_SEARCH_WORKERS=str(workers))
        processes: list[subprocess.Popen[bytes]] = []

        def stop_all() -> None:
            for process in reversed(processes):
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()

        stack.callback(stop_all)
        processes.append(subprocess.Popen(
            [*_command(), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            env=env, stdout=(logs / "serve.log").open("wb"), stderr=subprocess.STDOUT,
        ))
        client = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120))
        for _ in range(600):
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        if engine == "procrastinate":
            processes.extend(_start_worker(env, logs / f"worker{n}.log", f"bench{n}")
                             for n in range(worker_processes))
        client.post("/api/v1/plans", json=small_plan(10_000)).raise_for_status()  # warm

        start = time.perf_counter()
        locations = []
        for n in range(studies):
            body = {**study, "token_budget": study["token_budget"] + n}  # another study, not a replay
            submitted = client.post("/api/v1/studies", json=body)
            if submitted.status_code != 202:
                raise SystemExit(f"POST /api/v1/studies answered {submitted.status_code}: {submitted.text}")
            locations.append(submitted.headers["location"])
        walls: dict[str, float] = {}
        candidates = 0
        latencies: list[float] = []
        index = 0
        while len(walls) < len(locations):
            for location in locations:
                if location in walls:
                    continue
                state = client.get(location).json()
                if state["state"] not in ("queued", "running"):
                    if state["state"] != "succeeded":
                        raise SystemExit(f"the study ended {state['state']}: {state['error']}")
                    walls[location] = time.perf_counter() - start
                    candidates = state["num_candidates"]
            if len(walls) == len(locations):
                break
            if interval is None:
                time.sleep(0.05)
                continue
            sent = time.perf_counter()
            client.post("/api/v1/plans", json=small_plan(index)).raise_for_status()
            latencies.append(time.perf_counter() - sent)
            index += 1
            time.sleep(interval)
        return {"walls": [walls[location] for location in locations], "total": max(walls.values()),
                "latencies": latencies, "candidates": candidates}


def _stats(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (f"{len(latencies)} small POST /plans meanwhile: median "
            f"{statistics.median(ordered) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
            f"max {ordered[-1] * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("in-process", "procrastinate"), default="in-process")
    parser.add_argument("--workers", default="1,2",
                        help="study search pool sizes (per process that runs studies), comma-separated")
    parser.add_argument("--worker-processes", default="1",
                        help="procrastinate: `fsdp-planner worker` processes, comma-separated counts")
    parser.add_argument("--study", choices=sorted(STUDIES), default="issue25")
    parser.add_argument("--studies", type=int, default=1, help="studies submitted at the same moment")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between small plans")
    parser.add_argument("--no-small-plans", action="store_true", help="time the studies alone")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; engine {args.engine}")
    counts = [int(n) for n in args.worker_processes.split(",")] if args.engine == "procrastinate" else [1]
    totals: dict[tuple[int, int], float] = {}
    for workers in (int(w) for w in args.workers.split(",")):
        for processes in counts:
            for _ in range(args.repeats):
                result = run(workers, None if args.no_small_plans else args.interval, engine=args.engine,
                             worker_processes=processes, study=STUDIES[args.study], studies=args.studies)
                where = (f"{processes} worker process(es) x {workers} search process(es)"
                         if args.engine == "procrastinate" else f"{workers} study search worker(s)")
                walls = ", ".join(f"{wall:.1f}" for wall in result["walls"])
                print(f"{where}: {args.studies} x {args.study} ({result['candidates']} candidates) at once: "
                      f"wall {walls} s, all {result['total']:.1f} s"
                      + (f"; {_stats(result['latencies'])}" if result["latencies"] else ""), flush=True)
                totals.setdefault((workers, processes), result["total"])
    if len(totals) > 1:  # against the first combination, first repeat each
        (first, base), *others = totals.items()
        for (workers, processes), total in others:
            print(f"speed-up of {workers} search worker(s), {processes} process(es) over {first[0]}, "
                  f"{first[1]}: {base / total:.2f}x")


if __name__ == "__main__":
    main()
