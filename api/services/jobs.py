"""Where long work runs: the jobs of one web process (studies, large plan searches and re-plans), on
threads apart from the requests; one `InProcessJobs` per kind of job (api/services/job_kinds.py).

The embedded default (SQLite, no broker) runs every job in the web process that accepted it: a few job
threads (`Settings.study_jobs`) each run one study at a time, and the studies' searches go to a search
pool of their own, so a small `POST /plans` (the request pool) never queues behind a study's candidates.
The queue itself is the kind's table (`studies`, `plan_jobs`): a job is a row in state `queued`,
claimed by an atomic `queued -> running` update, so a web process that starts (or restarts) picks up
the queued jobs, and with several web processes on one database each job still runs once. While a
process runs jobs it says so (a heartbeat on their rows); every process queues again the running jobs
whose process has been silent too long (killed outright, its machine gone), and the claim's attempt
number keeps the silent job, should it wake, from writing anything. Plan jobs (large plan searches,
re-plans) get threads (`Settings.plan_jobs`) and a search pool of their own as well.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session, sessionmaker

from api.services import job_rows
from api.services.job_kinds import STUDIES, JobKind
from api.services.search_pool import SearchPool

log = logging.getLogger(__name__)


class InProcessJobs:
    """Runs the jobs of one kind (studies by default; plan jobs) on threads of this process, their
    searches in a pool of their own; `shutdown` puts a running study back in the queue."""

    def __init__(
        self, session_factory: sessionmaker[Session], *, search_pool: SearchPool, threads: int,
        stale_after_s: float, kind: JobKind = STUDIES,
    ):
        self.kind = kind
        self.session_factory = session_factory
        self.search_pool = search_pool
        self.threads = threads
        self.stale_after_s = stale_after_s
        self._executor: ThreadPoolExecutor | None = None
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()
        """Set by `shutdown` (until `start`): running jobs stop, nothing new is taken on."""
        self._lock = threading.Lock()
        self._mine: set[int] = set()
        """Studies submitted here and not finished (waiting for a job thread, or running)."""

    def start(self) -> None:
        """Run the studies left queued (by a restart, or by a process that stopped before them), and watch
        for running studies whose process went silent."""
        with self._lock:
            self._stopping.clear()
            self._start_watchdog()
        self._resume()

    def _resume(self) -> None:
        with self.session_factory() as session:
            stale = job_rows.requeue_stale(session, self.kind.table, stale_after_s=self.stale_after_s)
            queued = job_rows.queued(session, self.kind.table)
        if stale:
            log.warning("queued again %d %ss whose process went silent: %s", len(stale), self.kind.name,
                        stale)
        for study_id in queued:
            with self._lock:
                if study_id in self._mine:
                    continue  # waiting for a job thread here already
            self.submit(study_id)

    def enqueue(self, session: Session, study_id: int) -> None:
        """Nothing to store with the study: its queued row is the job (`submit` runs it once committed)."""

    def submit(self, study_id: int) -> None:
        """Run the study's job when a job thread is free (the row says whether it still should). After
        `shutdown` the study stays queued for the next `start` (of this process or another)."""
        with self._lock:
            if self._stopping.is_set():
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.threads,
                                                    thread_name_prefix=f"{self.kind.lock_prefix}-job")
            self._start_watchdog()
            self._mine.add(study_id)
            self._executor.submit(self._run, study_id)

    def _start_watchdog(self) -> None:
        if self._watchdog is None or not self._watchdog.is_alive():
            self._watchdog = threading.Thread(target=self._watch, name=f"{self.kind.lock_prefix}-heartbeat",
                                              daemon=True)
            self._watchdog.start()

    def _run(self, study_id: int) -> None:
        try:
            self.kind.run_job(self.session_factory, study_id, search_pool=self.search_pool,
                              stopping=self._stopping)
        finally:
            with self._lock:
                self._mine.discard(study_id)

    def _watch(self) -> None:
        """Beat for the studies this process runs; queue again (and run) those of silent processes."""
        # Four beats per timeout: a study is presumed dead only after several missed ones.
        while not self._stopping.wait(self.stale_after_s / 4):
            try:
                with self._lock:
                    mine = set(self._mine)
                with self.session_factory() as session:
                    job_rows.beat(session, self.kind.table, mine)
                self._resume()
            except Exception:  # the database blinked: beat again next time
                log.exception("%s heartbeat failed", self.kind.name)

    def shutdown(self) -> None:
        """Stop: running studies go back to `queued` at their next candidate, queued ones stay queued."""
        with self._lock:
            executor, self._executor = self._executor, None
            watchdog, self._watchdog = self._watchdog, None
            self._stopping.set()
            self._mine.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        if watchdog is not None:
            watchdog.join()
        self.search_pool.shutdown()
