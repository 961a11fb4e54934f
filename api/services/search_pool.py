"""The plan search, off the request workers: a pool of processes sized to the cores.

A search is pure CPU (planner/search.py). Run in the web process it holds the GIL, so reads and
small plans wait behind a large one; in a pool of processes it runs beside them on another core.
So does the advice a refused batch carries (it probes configurations on other clusters and batches:
seconds for a large model): the web process validates a request, and whatever prices runs here,
under the same deadline per plan.
Each web process (uvicorn worker) owns one pool, started with the app's lifespan and shut down with
it (the first search starts it where an embedding runs no lifespan). Workers fork from a
forkserver that has imported the planner already, so a new worker is ready in milliseconds, and no
worker inherits the web process's threads or database connections.

Workers die with their web process, however it ends (kill -9 included): a worker is the forkserver's
child, and the forkserver exits when the web process is gone. On Linux the kernel then kills the worker
(a parent-death signal); everywhere, a watchdog thread in the worker notices it was orphaned.

This module is what the workers import: it stays free of the database and the web framework (the
metrics' series are prometheus_client objects; only the web process records to them).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TypeVar

from api.lifeline import WATCHDOG_INTERVAL_S, signal_on_parent_death
from api.metrics import series as search_metrics
from planner.calibration import CalibrationProfile
from planner.deadline import CpuDeadline
from planner.errors import PlanningError
from planner.plan import Plan
from planner.precheck import batch_hint, batch_refusal
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import PlanRequest

_T = TypeVar("_T")


@dataclass(frozen=True)
class SearchJob:
    """One search of `SearchPool.search_many`: a request and the calibration to plan it with."""

    request: PlanRequest
    calibration: CalibrationProfile | None = None
    calibration_id: str | None = None
    advise_other_clusters: bool = True
    """Whether a refusal for memory searches other clusters for the smallest that fits (a study
    tries its own sizes and does not)."""


class SearchPoolBrokenError(RuntimeError):
    """A worker died mid-search (killed, out of memory); the pool is replaced for the next one."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class SearchPool:
    """Runs `make_plan` in worker processes; `search` blocks the calling (worker) thread only."""

    def __init__(self, *, workers: int, deadline_s: float) -> None:
        self.workers = workers
        self.deadline_s = deadline_s
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Create the pool and start one worker in the background (idempotent)."""
        self._running()

    def _running(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = _new_executor(self.workers)
                self._executor.submit(os.getpid)  # warm: the forkserver and a worker start now
            return self._executor

    def shutdown(self) -> None:
        """Stop the workers; searches still queued are cancelled, running ones finish."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def search(
        self, request: PlanRequest, calibration: CalibrationProfile | None, calibration_id: str | None
    ) -> Plan:
        """The plan, searched in a worker within `deadline_s` seconds of CPU time.

        Raises what make_plan raises (PlanningError and its subclasses, SearchDeadlineError) and
        SearchPoolBrokenError when the worker died.
        """
        started = time.perf_counter()
        outcome = "failed"
        try:
            plan = self._run(_search, request, calibration, calibration_id, self.deadline_s)
            outcome = "planned"
            return plan
        except PlanningError:
            outcome = "refused"
            raise
        finally:
            search_metrics.observe_search(outcome=outcome, seconds=time.perf_counter() - started)

    def batch_refusal(self, request: PlanRequest, tokens: int) -> PlanningError:
        """The refusal of a batch of `tokens` on `request`'s cluster (planner.precheck.batch_refusal,
        priced uncalibrated), its advice looked for in a worker within `deadline_s` seconds of CPU
        time (past it, the refusal names the nearest batches that split, unchecked for memory).
        Raises SearchPoolBrokenError when the worker died."""
        return self._run(_batch_refusal, request, tokens, self.deadline_s)

    def batch_hint(
        self, request: PlanRequest, calibration: CalibrationProfile | None, calibration_id: str | None
    ) -> str:
        """The dashboard form's line under the batch (planner.precheck.batch_hint, priced as the
        search would be), worked out in a worker within `deadline_s` seconds of CPU time. Raises
        SearchPoolBrokenError when the worker died."""
        return self._run(_batch_hint, request, calibration, calibration_id, self.deadline_s)

    def _run(self, work: Callable[..., _T], *args: object) -> _T:
        """`work(*args)` in a worker (a function of this module: workers import it by name)."""
        executor = self._running()
        try:
            return executor.submit(work, *args).result()
        except BrokenProcessPool:
            self._discard(executor)
            raise SearchPoolBrokenError("the search process stopped before answering") from None

    def search_many(
        self, jobs: Sequence[SearchJob], *, on_done: Callable[[int], None] | None = None,
        on_result: Callable[[int, Plan | PlanningError], None] | None = None,
    ) -> list[Plan | PlanningError]:
        """Plans for independent requests (each with its calibration, or none), searched in parallel on all
        workers: per job (in order) its Plan, or the PlanningError that refused it. As searches finish,
        `on_result(index, outcome)` then `on_done(count)` are called (progress); an exception they raise
        stops the searches not started yet and propagates. Raises SearchPoolBrokenError when a worker
        died."""
        executor = self._running()
        futures = {executor.submit(_search_or_refuse, job, self.deadline_s): i for i, job in enumerate(jobs)}
        results: list[Plan | PlanningError | None] = [None] * len(jobs)
        try:
            for done, future in enumerate(as_completed(futures), start=1):
                results[futures[future]] = outcome = future.result()
                if on_result is not None:
                    on_result(futures[future], outcome)
                if on_done is not None:
                    on_done(done)
        except BrokenProcessPool:
            self._discard(executor)
            raise SearchPoolBrokenError("a search process stopped before answering") from None
        finally:
            for future in futures:
                future.cancel()  # when the caller gave up (an exception): searches not started never run
        return [result for result in results if result is not None]  # every one is set by now

    def _discard(self, executor: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is executor:  # replace it once, whoever notices first
                self._executor = None
        executor.shutdown(wait=False, cancel_futures=True)


def _new_executor(workers: int) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("forkserver")
    # Read by the forkserver when it starts (once per web process): workers fork with the planner imported.
    context.set_forkserver_preload([__name__])
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(os.getpid(),)
    )


def _init_worker(server_pid: int) -> None:
    """Runs first in every worker: `server_pid` is the web process that created the pool."""
    # Ctrl-C reaches the whole process group: the web process shuts the pool down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_server(server_pid)


def _die_with_server(server_pid: int) -> None:
    """End this worker when its server is gone, however the server ended.

    A worker waits on a queue whose write end it holds itself, so it never sees the server go; its
    parent is the forkserver, which exits when the last holder of the server's "alive" pipe closes it.
    Every forkserver child inherits that pipe (to fork children of its own, which no search does), so
    without closing it here the forkserver and the workers would wait on each other for good.
    """
    parent = os.getppid()  # the forkserver: it cannot exit yet, this worker still holds the alive pipe
    # The kernel kills this worker the moment its parent exits, even in the middle of a search.
    signal_on_parent_death(signal.SIGKILL)
    # Armed while the forkserver is surely alive; only now may the server's death reach it.
    forkserver = multiprocessing.forkserver._forkserver  # private: the pipe has no public handle
    if getattr(forkserver, "_forkserver_alive_fd", None) is not None:
        os.close(forkserver._forkserver_alive_fd)
        forkserver._forkserver_alive_fd = None
    if _orphaned(parent, server_pid):  # the forkserver was killed before the signal was armed
        os._exit(1)
    # Portable, and the fallback where the signal is missing: notice being orphaned within moments.
    threading.Thread(
        target=_watch_parent, args=(parent, server_pid), name="parent-watchdog", daemon=True
    ).start()


def _watch_parent(parent: int, server_pid: int) -> None:
    while not _orphaned(parent, server_pid):
        time.sleep(WATCHDOG_INTERVAL_S)
    os._exit(1)  # nobody will ever read this worker's answer


def _orphaned(parent: int, server_pid: int) -> bool:
    """Whether this worker's parent (pid `parent`) or its server is gone."""
    if os.getppid() != parent:  # reparented: the parent exited
        return True
    try:
        os.kill(server_pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, under another user
    return False


def _search(
    request: PlanRequest,
    calibration: CalibrationProfile | None,
    calibration_id: str | None,
    deadline_s: float,
) -> Plan:
    """What a worker runs (pickled by name: workers import this module)."""
    return make_plan(request, calibration=calibration, calibration_id=calibration_id, time_limit_s=deadline_s)


def _batch_refusal(request: PlanRequest, tokens: int, deadline_s: float) -> PlanningError:
    """What a worker runs for `SearchPool.batch_refusal`: the refusal is the answer (returned)."""
    try:
        return batch_refusal(request, tokens, deadline=CpuDeadline.after(deadline_s))
    except PlanningError as error:  # a pin the model cannot take: refused for that instead
        return error


def _batch_hint(
    request: PlanRequest,
    calibration: CalibrationProfile | None,
    calibration_id: str | None,
    deadline_s: float,
) -> str:
    """What a worker runs for `SearchPool.batch_hint`."""
    deadline = CpuDeadline.after(deadline_s)
    return batch_hint(request, build_setting(request, calibration, calibration_id), deadline=deadline)


def _search_or_refuse(job: SearchJob, deadline_s: float) -> Plan | PlanningError:
    """What a worker runs for one job of `search_many`: a refusal is an answer, not a failure."""
    try:
        return make_plan(job.request, calibration=job.calibration, calibration_id=job.calibration_id,
                         time_limit_s=deadline_s, advise_other_clusters=job.advise_other_clusters)
    except PlanningError as error:
        return error
