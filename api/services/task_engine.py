"""Studies as jobs of procrastinate, the PostgreSQL task engine (`FSDP_PLANNER_JOB_ENGINE=procrastinate`).

The web process (`ProcrastinateJobs`) runs no study: `POST /studies` stores the study and defers its job
in one transaction (on the same connection), so a study is never stored without its job nor a job
without its study, and a job is in the database from the commit on (a restart of the API loses none).
`fsdp-planner worker` processes (`run_worker`; any number, on any machine, same `DATABASE_URL`) take the
jobs of the `studies` queue, each running up to `Settings.study_jobs` studies at once, their searches in
a search pool of their own (`Settings.study_search_workers` processes): a small `POST /plans` is answered
by the web process's own search pool and never waits behind a study.

Each study has one job at a time: the job's `queueing_lock` allows one waiting job per study and its
`lock` one running job per study. A job runs `studies.run_study_job`, whose claim numbers the attempt.

A worker killed mid-job (SIGKILL, its machine gone) stops sending procrastinate's worker heartbeat.
Every worker looks for the jobs of workers silent for `Settings.study_stale_after_s` (procrastinate's
stalled jobs) and retries them: another worker takes the job again and runs the study from its first
candidate (`take_over`: the study still says `running`); the dead attempt's writes are fenced by its
attempt number, and a study's plans and points are stored by the one transaction that ends it, so they
are stored once, whatever died when. A worker stopped by SIGTERM/SIGINT stops its studies at their next
candidate, queues them again and retries their jobs at once, for the next worker.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from api.services import job_rows
from api.services import studies as study_service
from api.services.job_kinds import KINDS, PLAN_JOBS, STUDIES, JobKind
from api.services.search_pool import SearchPool

log = logging.getLogger(__name__)

SCHEMA = "procrastinate"
"""The PostgreSQL schema of procrastinate's tables and functions (migration 0006)."""
STUDY_QUEUE = STUDIES.queue
STUDY_TASK = STUDIES.task
MAX_JOB_ATTEMPTS = 5
"""A job whose worker died (or stopped) this many times fails, saying so, instead of killing more."""


def study_lock(study_id: int) -> str:
    return STUDIES.lock(study_id)


def conninfo(database_url: str) -> str:
    """The libpq connection string of a SQLAlchemy PostgreSQL URL."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"the procrastinate job engine needs PostgreSQL, not {url.get_backend_name()}")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def _procrastinate_path(session: Session) -> Iterator[None]:
    """Within the session's transaction, procrastinate's schema first on the search path."""
    previous = session.execute(text("SELECT current_setting('search_path')")).scalar_one()
    session.execute(text("SELECT set_config('search_path', :path, true)"),
                    {"path": f"{SCHEMA}, {previous}"})
    try:
        yield
    finally:
        session.execute(text("SELECT set_config('search_path', :path, true)"), {"path": previous})


def defer_study(session: Session, study_ids: list[int]) -> None:
    """Store a job for each study in the session's transaction (committed with it)."""
    defer_jobs(session, STUDIES, study_ids)


def defer_jobs(session: Session, kind: JobKind, job_ids: list[int]) -> None:
    """Store a task-engine job for each row of `kind` in the session's transaction (committed with it)."""
    import procrastinate

    if not job_ids:
        return
    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector())  # never opened: no pool
    connection = session.connection().connection.driver_connection
    with _procrastinate_path(session):
        for job_id in job_ids:
            app.configure_task(
                kind.task, queue=kind.queue, lock=kind.lock(job_id), queueing_lock=kind.lock(job_id),
                connection=connection,
            ).defer(**{kind.kwarg: job_id})


def studies_without_job(session: Session) -> list[int]:
    """Queued or running studies that have no waiting or running job."""
    return rows_without_job(session, STUDIES)


def rows_without_job(session: Session, kind: JobKind) -> list[int]:
    """Queued or running rows of `kind` that have no waiting or running job (queued while the deployment
    ran the in-process engine, or whose job ended without ending the row): they get a job again."""
    ids = session.scalars(text(f"""
        SELECT s.id FROM {kind.table.__tablename__} s
         WHERE s.state IN ('queued', 'running')
           AND NOT EXISTS (SELECT 1 FROM {SCHEMA}.procrastinate_jobs j
                            WHERE j.lock = '{kind.lock_prefix}:' || s.id AND j.status IN ('todo', 'doing'))
         ORDER BY s.id""")).all()
    session.commit()
    return list(ids)


class ProcrastinateJobs:
    """The web process's side: studies (or plan jobs) are deferred as jobs with the transaction that
    stores them."""

    def __init__(self, kind: JobKind = STUDIES):
        self.kind = kind

    def start(self) -> None:
        """Nothing runs here: workers run the jobs."""

    def enqueue(self, session: Session, study_id: int) -> None:
        defer_jobs(session, self.kind, [study_id])

    def submit(self, study_id: int) -> None:
        """Deferred already, with the study (`enqueue`)."""

    def shutdown(self) -> None:
        """Queued jobs stay in the database; nothing to stop."""


class StudyRequeuedError(Exception):
    """The worker is stopping: the study went back to the queue, the job is retried for another worker."""


class StudyWorker:
    """One `fsdp-planner worker` process: procrastinate workers on the studies queue and on the plans
    queue (large plan searches and re-plans), each kind with its own job slots and search pool, plus a
    maintenance loop (heartbeats on the jobs it runs, retries of stalled jobs, jobs for rows without one).
    """

    def __init__(
        self, database_url: str, session_factory: sessionmaker[Session], *, search_pool: SearchPool,
        concurrency: int, stale_after_s: float, name: str | None = None,
        plan_search_pool: SearchPool | None = None, plan_concurrency: int = 1,
    ):
        import procrastinate

        self.session_factory = session_factory
        self.search_pool = search_pool
        self.plan_search_pool = plan_search_pool or SearchPool(workers=plan_concurrency,
                                                               deadline_s=search_pool.deadline_s)
        self.concurrency = concurrency
        self.plan_concurrency = plan_concurrency
        self.stale_after_s = stale_after_s
        self.name = name
        self.stopping = threading.Event()
        self._running: dict[JobKind, set[int]] = {kind: set() for kind in KINDS}
        self._lock = threading.Lock()
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=conninfo(database_url), kwargs={"options": f"-c search_path={SCHEMA}"},
            # Each queue's worker holds one connection for LISTEN; heartbeats, fetches, abort polls and
            # the maintenance loop must never queue behind the jobs' own queries.
            min_size=1, max_size=concurrency + plan_concurrency + 8,
        ))
        retry = procrastinate.RetryStrategy(
            max_attempts=MAX_JOB_ATTEMPTS, wait=1,
            retry_exceptions={StudyRequeuedError, DBAPIError},  # stopping; the database blinked
        )
        self.app.task(name=STUDY_TASK, queue=STUDY_QUEUE, pass_context=True, retry=retry)(self._run_study)
        self.app.task(name=PLAN_JOBS.task, queue=PLAN_JOBS.queue, pass_context=True, retry=retry)(
            self._run_plan_job)

    def _run_study(self, context: Any, study_id: int) -> None:
        end = self._run(STUDIES, study_id, self.search_pool)
        if end is study_service.JobEnd.requeued:
            raise StudyRequeuedError(f"study {study_id} queued again: its worker is stopping")

    def _run_plan_job(self, context: Any, plan_job_id: int) -> None:
        self._run(PLAN_JOBS, plan_job_id, self.plan_search_pool)

    def _run(self, kind: JobKind, job_id: int, pool: SearchPool) -> job_rows.JobEnd:
        with self._lock:
            self._running[kind].add(job_id)
        try:
            # The job's lock lets no other job of this row run: a `running` row is a dead attempt's.
            return kind.run_job(self.session_factory, job_id, search_pool=pool, stopping=self.stopping,
                                take_over=True)
        finally:
            with self._lock:
                self._running[kind].discard(job_id)

    async def run(self) -> None:
        """Run until SIGTERM or SIGINT (then: running studies back to the queue, their jobs retried)."""
        from procrastinate.worker import Worker

        async with self.app.open_async():
            def worker(kind: JobKind, concurrency: int) -> Worker:
                suffix = "" if kind is STUDIES else f"/{kind.queue}"
                return Worker(
                    self.app, queues=[kind.queue], name=None if self.name is None else self.name + suffix,
                    concurrency=concurrency, install_signal_handlers=False,
                    fetch_job_polling_interval=min(5.0, self.stale_after_s / 2),
                    update_heartbeat_interval=self.stale_after_s / 4,
                    stalled_worker_timeout=self.stale_after_s,
                )

            # One procrastinate worker per queue: a re-plan never waits for a study's job slot.
            workers = [worker(STUDIES, self.concurrency), worker(PLAN_JOBS, self.plan_concurrency)]

            def stop() -> None:
                log.info("stopping: running studies go back to the queue")
                self.stopping.set()
                for each in workers:
                    each.stop()

            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop)
            maintenance = asyncio.create_task(self._maintain(), name="job-maintenance")
            try:
                await asyncio.gather(*(each.run() for each in workers))
            finally:
                maintenance.cancel()
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
                await asyncio.to_thread(self.plan_search_pool.shutdown)

    async def _maintain(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._beat)
                await self.retry_stalled_jobs()
                await asyncio.to_thread(self._defer_orphans)
            except asyncio.CancelledError:
                raise
            except Exception:  # the database blinked: again next time
                log.exception("job worker maintenance failed")
            await asyncio.sleep(self.stale_after_s / 4)

    def _beat(self) -> None:
        with self._lock:
            running = {kind: set(ids) for kind, ids in self._running.items()}
        with self.session_factory() as session:
            for kind, ids in running.items():
                job_rows.beat(session, kind.table, ids)

    def _defer_orphans(self) -> None:
        with self.session_factory() as session:
            for kind in KINDS:
                orphans = rows_without_job(session, kind)
                if orphans:
                    defer_jobs(session, kind, orphans)
                    session.commit()
                    log.warning("deferred jobs for %d %ss that had none: %s", len(orphans), kind.name,
                                orphans)

    async def retry_stalled_jobs(self) -> list[int]:
        """Retry the jobs of workers silent for `stale_after_s` (killed, their machine gone), or fail their
        rows after MAX_JOB_ATTEMPTS; the jobs' ids. A job this process is running is never retried."""
        from procrastinate import exceptions, jobs

        manager = self.app.job_manager
        retried = []
        for kind in KINDS:
            stalled = await manager.get_stalled_jobs(queue=kind.queue,
                                                     seconds_since_heartbeat=self.stale_after_s)
            with self._lock:
                running_here = set(self._running[kind])
            for job in stalled:
                assert job.id is not None
                row_id = int(job.task_kwargs[kind.kwarg])
                if row_id in running_here:
                    # Alive in this process: its heartbeat was only late (a loaded machine, a pool
                    # busy); retrying it would run the row twice and cancel the run that is working.
                    continue
                try:
                    if job.attempts + 1 >= MAX_JOB_ATTEMPTS:
                        await manager.finish_job(job, status=jobs.Status.FAILED, delete_job=False)
                        reason = (f"the workers running this {kind.name} stopped {job.attempts + 1} times "
                                  "(killed, out of memory, machine lost); submit it again"
                                  + (" with fewer or smaller candidates" if kind is STUDIES else ""))
                        await asyncio.to_thread(self._give_up, kind, row_id, reason)
                        log.error("%s %s failed: %s", kind.name, row_id, reason)
                    else:
                        await manager.retry_job(job)
                        log.warning("retrying job %s of %s %s: its worker went silent", job.id, kind.name,
                                    row_id)
                    retried.append(job.id)
                except exceptions.ConnectorException:  # another worker retried it first
                    log.info("job %s of %s %s was retried by another worker", job.id, kind.name, row_id)
        return retried

    def _give_up(self, kind: JobKind, row_id: int, reason: str) -> None:
        with self.session_factory() as session:
            job_rows.give_up(session, kind.table, row_id, reason)
