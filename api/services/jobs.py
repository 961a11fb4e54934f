"""Where long work runs: the study jobs of one web process, on threads apart from the requests.

The embedded default (SQLite, no broker) runs every job in the web process that accepted it: a few job
threads (`Settings.study_jobs`) each run one study at a time, and the studies' searches go to a search
pool of their own, so a small `POST /plans` (the request pool) never queues behind a study's candidates.
The queue itself is the `studies` table: a job is a row in state `queued`, claimed by an atomic
`queued -> running` update, so a web process that starts (or restarts) picks up the queued studies,
and with several web processes on one database each study still runs once.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session, sessionmaker

from api.services import studies as study_service
from api.services.search_pool import SearchPool

log = logging.getLogger(__name__)


class InProcessJobs:
    """Runs study jobs on threads of this process; `shutdown` puts a running study back in the queue."""

    def __init__(self, session_factory: sessionmaker[Session], *, search_pool: SearchPool, threads: int):
        self.session_factory = session_factory
        self.search_pool = search_pool
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Run the studies left queued (by a restart, or by a process that stopped before them)."""
        with self.session_factory() as session:
            queued = study_service.queued_studies(session)
        for study_id in queued:
            self.submit(study_id)
        if queued:
            log.info("resumed %d queued studies", len(queued))

    def submit(self, study_id: int) -> None:
        """Run the study's job when a job thread is free (the row says whether it still should)."""
        with self._lock:
            if self._executor is None:
                self._stopping.clear()
                self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="study-job")
            self._executor.submit(self._run, study_id)

    def _run(self, study_id: int) -> None:
        study_service.run_study_job(self.session_factory, study_id, search_pool=self.search_pool,
                                    stopping=self._stopping)

    def shutdown(self) -> None:
        """Stop: running studies go back to `queued` at their next candidate, queued ones stay queued."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._stopping.set()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self.search_pool.shutdown()
