"""`fsdp-planner serve --workers N`: uvicorn's supervisor, whose web processes end with it at any moment
and are given the time they need to start.

`serve` replaces itself (same pid) with `python -m api.web_supervisor`, because of how uvicorn starts a
web process: multiprocessing's spawn, which first imports the parent's main module in the child. Under
`fsdp-planner` that module is the whole command line, the service with it (0.8 s of CPU on an idle
machine), and uvicorn replaces a child that has not answered its health ping within 5 s: on a loaded
machine (load average 10-15 on 2 cores) every child was replaced while still importing, again and again,
and the service was not ready after 60 s. This module imports the standard library and uvicorn only, so a
child answers pings a fraction of a second after it starts and imports the app afterwards.

A web process
- ends with its supervisor however the supervisor ends (`kill -9` included), at any moment: the
  parent-death signal is armed first thing in the child, before the app is imported (api/lifeline.py).
  It is SIGKILL while the app is imported; once the app's start-up begins, SIGTERM: uvicorn stops in
  order, its search pool with it (api/services/search_pool.py);
- is never killed for being slow to start: until it says that its server has started, the supervisor only
  checks that it is alive; from then on uvicorn's health check applies (a web process that does not
  answer within HEALTH_TIMEOUT_S is replaced);
- writes its metrics where the others do (`PROMETHEUS_MULTIPROC_DIR`), so that `/metrics` answered by
  any of them counts the requests, plans and jobs of all of them (api/metrics/endpoint.py).
"""

from __future__ import annotations

import argparse
import glob
import os
import pickle
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from socket import socket

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process, logger

from api.lifeline import end_with_parent
from api.metrics import MULTIPROCESS_DIR_ENV

APP = "api.app:create_app"
HEALTH_TIMEOUT_S = 30
"""A started web process that does not answer the supervisor's ping for this long is replaced. uvicorn's
5 s is short for a busy machine, where the answering thread may wait seconds for the CPU and the GIL (one
start at load average 29 on 2 cores had 2 replacements); a hung process is rare, and replacing a slow one
loses its requests."""


class WebProcess(Process):
    """One web process (uvicorn's `Process`), which ends with the supervisor that created it."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self.supervisor_pid = os.getpid()
        self.serving = False
        """In the supervisor: the child has said that its server started."""
        self._pinged = False
        """In the supervisor: a ping waits for the child's answer."""

    def target(self, sockets: list[socket] | None = None) -> None:
        # In the child, before anything is imported: the app's import takes seconds on a loaded machine.
        # Until the app starts there is nothing to stop in order (api/app.py then asks for SIGTERM).
        end_with_parent(self.supervisor_pid, signal_number=signal.SIGKILL)
        super().target(sockets)

    def starting(self) -> bool:
        """In the supervisor: whether the child is alive and has not said yet that its server started.

        Never waits: the child answers pings once uvicorn's answering thread runs in it, which may be
        seconds away on a loaded machine; one ping at a time, so that the answer read is a fresh one."""
        if self.serving or not self.process.is_alive():
            return False
        try:
            if not self._pinged:
                self.parent_conn.send(b"ping")
                self._pinged = True
            if self.parent_conn.poll():
                self._pinged = False
                self.serving = self.parent_conn.recv() is True
        except (OSError, EOFError, pickle.UnpicklingError):
            return False  # its end of the pipe is gone: it died
        return not self.serving


class Supervisor(Multiprocess):
    """uvicorn's supervisor, with `WebProcess`es and no health deadline while they start."""

    processes: list[WebProcess]  # type: ignore[assignment]

    def _start_process(self) -> WebProcess:
        process = WebProcess(self.config, self.sockets)
        process.start()
        return process

    def init_processes(self) -> None:
        self.processes.extend(self._start_process() for _ in range(self.processes_num))

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return  # stopping: nothing to replace
        for idx, process in enumerate(self.processes):
            if process.starting():
                continue
            if process.serving and process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            hung = process.process.is_alive()
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                # The app, the database or the socket is broken: every restart would fail the same way.
                logger.error(f"Child process [{process.pid}] failed to start, stopping the parent process.")
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            if hung:
                logger.warning(f"Child process [{process.pid}] did not answer its health check within "
                               f"{self.config.timeout_worker_healthcheck} s: replaced")
            else:
                logger.info(f"Child process [{process.pid}] died")
            self.processes[idx] = self._start_process()

    def restart_all(self) -> None:
        """SIGHUP: replace each web process, bringing its replacement into service before stopping the old
        one (uvicorn's, with `WebProcess`es; a replacement that is not ready in time is dropped)."""
        for idx, old_process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new_process = self._start_process()
            if not new_process.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new_process.kill()
                new_process.join()
                if not self.should_exit.is_set():
                    logger.error(f"New child process [{new_process.pid}] was not ready in time; keeping "
                                 f"worker [{old_process.pid}] and aborting the restart.")
                return
            new_process.serving = True
            old_process.terminate()
            old_process.join()
            self.processes[idx] = new_process

    def handle_ttin(self) -> None:
        logger.info("Received SIGTTIN, increasing the number of processes.")
        self.processes_num += 1
        self.processes.append(self._start_process())


def main() -> None:
    """Run by `fsdp-planner serve --workers N` (which has migrated the database and set the environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m api.web_supervisor", description="The supervisor of `fsdp-planner serve --workers N`."
    )
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--log-level", required=True)
    args = parser.parse_args()
    config = Config(APP, factory=True, host=args.host, port=args.port, workers=args.workers,
                    log_level=args.log_level, proxy_headers=True, timeout_worker_healthcheck=HEALTH_TIMEOUT_S)
    with shared_metrics_directory():
        Supervisor(config, sockets=[config.bind_socket()]).run()


@contextmanager
def shared_metrics_directory() -> Iterator[None]:
    """The web processes' shared `PROMETHEUS_MULTIPROC_DIR` while the block runs, so that `/metrics` adds
    up all of them whichever answers: a fresh directory, removed afterwards; or the operator's own,
    emptied of the files of an earlier run first (their counts would be added in again)."""
    chosen = os.environ.get(MULTIPROCESS_DIR_ENV)
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        for stale in glob.glob(os.path.join(chosen, "*.db")):
            os.remove(stale)
        yield
        return
    directory = tempfile.mkdtemp(prefix="fsdp-planner-metrics-")
    os.environ[MULTIPROCESS_DIR_ENV] = directory  # inherited by the web processes uvicorn spawns
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
