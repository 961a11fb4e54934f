"""Benchmark: how long `fsdp-planner serve --workers N` takes to be ready with the CPU busy (not a test).

    python bench/serve_startup.py [--runs 3] [--burners 0 4 8] [--workers 2] [--timeout 120]

For each number of burners (processes spinning on the CPU beside the server, like `stress -c`): a fresh
SQLite database, `serve --workers N` on a loopback port, timed from its start to the supervisor's start
(the command line and the migration), to the first `/readyz` 200, and to every web process having said
"Application startup complete"; web processes the supervisor replaced are counted (dead, or silent past
the health check's timeout). Issue 38 item 10: with uvicorn's own supervisor a loaded machine replaced
every web process while it imported, again and again, and the service was not ready after 60 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
BURNER = "while True: pass"


@dataclass
class Startup:
    burners: int
    load: float
    supervisor_s: float | None
    ready_s: float | None
    all_started_s: float | None
    replaced: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_start(*, burners: int, workers: int, timeout_s: float) -> Startup:
    spinning = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(burners)]
    lines: list[tuple[float, str]] = []
    try:
        time.sleep(1.0)  # the burners are on the CPU before the server starts
        port = free_port()
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3"}
            start = time.monotonic()
            server = subprocess.Popen(
                [sys.executable, "-m", "api.cli.main", "serve", "--port", str(port),
                 "--workers", str(workers), "--log-level", "info"],
                cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            assert server.stdout is not None
            reader = threading.Thread(
                target=lambda: lines.extend((time.monotonic() - start, line) for line in server.stdout),
                daemon=True,
            )
            reader.start()
            ready_s = all_started_s = None
            try:
                while time.monotonic() - start < timeout_s:
                    if ready_s is None:
                        try:
                            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                                ready_s = time.monotonic() - start
                        except httpx.TransportError:
                            pass
                    started = [t for t, line in list(lines) if "Application startup complete" in line]
                    if len(started) >= workers:
                        all_started_s = started[workers - 1]
                    if ready_s is not None and all_started_s is not None:
                        break
                    time.sleep(0.2)
                load = os.getloadavg()[0]
            finally:
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
                reader.join(timeout=5)
    finally:
        for burner in spinning:
            burner.kill()
            burner.wait()
    for t, line in lines:
        if "Child process" in line and ("died" in line or "did not answer" in line):
            print(f"  at {t:.1f} s: {line.strip()}", file=sys.stderr)
    supervisor = [t for t, line in lines if "Started parent process" in line]
    return Startup(
        burners=burners, load=load, supervisor_s=supervisor[0] if supervisor else None, ready_s=ready_s,
        all_started_s=all_started_s,
        replaced=sum("Child process" in line and ("died" in line or "did not answer" in line)
                     for _, line in lines),
    )


def seconds(value: float | None, timeout_s: float) -> str:
    return f"{value:.1f}" if value is not None else f"> {timeout_s:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burners", type=int, nargs="+", default=[0, 4, 8])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"serve --workers {args.workers}")
    print("| burners | load average (1 min) at ready | supervisor up s | first /readyz s | "
          "all web processes started s | web processes replaced |")
    print("|---:|---:|---:|---:|---:|---:|")
    for burners in args.burners:
        for _ in range(args.runs):
            s = one_start(burners=burners, workers=args.workers, timeout_s=args.timeout)
            print(f"| {s.burners} | {s.load:.1f} | {seconds(s.supervisor_s, args.timeout)} | "
                  f"{seconds(s.ready_s, args.timeout)} | {seconds(s.all_started_s, args.timeout)} | "
                  f"{s.replaced} |", flush=True)


if __name__ == "__main__":
    main()
