"""A real `fsdp-planner` server process for end-to-end tests (one implementation, shared by all suites)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# A bound for a server that will never start, not a speed goal: on a loaded 2-core machine (load average
# 10-15) `serve --workers 2` takes a minute to be ready (bench/RESULTS.md, "serve --workers N on a busy
# machine").
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_server(
    *, env: dict[str, str], log: Path, cwd: Path = REPO_ROOT, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """`fsdp-planner serve [args]` on a free loopback port, as the README runs it; yields its base URL
    once /readyz answers, and stops it afterwards. Its output goes to `log` (shown if it fails to start)."""
    with started_server(env=env, log=log, cwd=cwd, args=args) as (process, url):
        wait_until_ready(process, url, log=log)
        yield url


@contextmanager
def started_server(
    *, env: dict[str, str], log: Path, cwd: Path = REPO_ROOT, args: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`fsdp-planner serve [args]` as `running_server` starts it, yielded at once (process, base URL): for
    tests of what happens while it starts. Stopped afterwards."""
    port = free_port()
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "api.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning", *args],
            cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_ready(process: subprocess.Popen[bytes], url: str, *, log: Path) -> None:
    """Until the server at `url` answers /readyz (a test failure, with its log, if it exits or takes more
    than START_TIMEOUT_S)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"no server after {START_TIMEOUT_S:.0f} s:\n{log.read_text()}")
        time.sleep(0.1)
