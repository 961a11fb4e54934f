"""`serve --workers N`'s supervisor (api/web_supervisor.py) and api/lifeline.py (issue 38 items 9 and 10):
web processes end with a supervisor killed outright at any moment of their start-up, and a web process
slow to start is given the time it needs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.api.test_search_pool import _cmdline, children, descendants, running
from tests.live_server import START_TIMEOUT_S, started_server, wait_until_ready

# A process that arms end_with_parent for its parent (argv[1]) after argv[2] seconds, says so, and waits.
CHILD = """
import signal, sys, time
from api.lifeline import end_with_parent
time.sleep(float(sys.argv[2]))
end_with_parent(int(sys.argv[1]), signal_number=signal.SIGKILL)
print("armed", flush=True)
time.sleep(600)
"""
# Its parent: starts it, prints its pid, and waits to be killed.
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]])
print(child.pid, flush=True)
time.sleep(600)
"""


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("arms_after_s", [0.0, 2.0], ids=["parent-killed-after-arming", "parent-gone-before"])
def test_a_process_ends_with_its_parent_whenever_the_parent_ends(arms_after_s: float) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(arms_after_s)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        if arms_after_s == 0.0:
            assert parent.stdout.readline() == "armed\n"  # armed while its parent runs
        parent.kill()  # before the child arms in the second case: nobody is left to signal it
        parent.wait()
        assert not gone_within([child], 15 + arms_after_s)
        if arms_after_s:
            assert parent.stdout.read() == ""  # it never went on past arming
    finally:
        parent.kill()
        parent.wait()


def web_processes(supervisor: int, count: int, *, timeout_s: float = START_TIMEOUT_S) -> list[int]:
    """The supervisor's `count` web processes, once it has spawned them (before they have started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spawned = [pid for pid in children(supervisor) if "spawn_main" in _cmdline(pid)]
        if len(spawned) >= count:
            return spawned
        time.sleep(0.02)
    raise AssertionError(f"the supervisor {supervisor} spawned no {count} web processes in {timeout_s} s")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("after_s", [0.0, 1.0, 3.0])
def test_web_processes_end_with_a_supervisor_killed_while_they_start(
    database_url: str, tmp_path: Path, after_s: float
) -> None:
    """kill -9 of the supervisor while its web processes start (unpickling, importing the app, starting
    their search pools: where depends on the machine's load) leaves nothing running or serving."""
    env = {**os.environ, "DATABASE_URL": database_url, "FSDP_PLANNER_SEARCH_WORKERS": "1"}
    log = tmp_path / "serve.log"
    with started_server(env=env, log=log, cwd=tmp_path, args=("--workers", "2")) as (server, url):
        web_processes(server.pid, 2)
        time.sleep(after_s)
        processes = descendants(server.pid)
        os.kill(server.pid, signal.SIGKILL)
        left = gone_within(processes, 15)
        assert not left, [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/readyz", timeout=2)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_web_process_slow_to_start_is_not_replaced(database_url: str, tmp_path: Path) -> None:
    """Web processes stopped for 8 s as they start (as a loaded machine starves them) are waited for:
    uvicorn's own supervisor replaced any that had not answered its ping within 5 s, again and again."""
    env = {**os.environ, "DATABASE_URL": database_url, "FSDP_PLANNER_SEARCH_WORKERS": "1"}
    log = tmp_path / "serve.log"
    with started_server(env=env, log=log, cwd=tmp_path, args=("--workers", "2")) as (server, url):
        web = web_processes(server.pid, 2)
        for pid in web:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(8)
        for pid in web:
            with contextlib.suppress(ProcessLookupError):  # uvicorn's supervisor has replaced it
                os.kill(pid, signal.SIGCONT)
        wait_until_ready(server, url, log=log)
        # Both have started (each has a search pool, which starts with the app), and are the first two.
        deadline = time.monotonic() + 60
        while not all(map(has_a_search_pool, web)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(map(has_a_search_pool, web)), log.read_text()
        assert sorted(web_processes(server.pid, 2)) == sorted(web), log.read_text()


def has_a_search_pool(pid: int) -> bool:
    return any("forkserver" in _cmdline(child) for child in children(pid))
