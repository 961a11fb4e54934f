"""The kinds of job the job engines run, each described once: its table (the row is the job), the
function that runs one, and its task-engine names (procrastinate task, queue, lock).

Studies and plan jobs (large plan searches, re-plans) go through the same engines: the in-process engine
(api/services/jobs.py) runs each kind on job threads and a search pool of its own, procrastinate workers
(api/services/task_engine.py) take each kind from a queue of its own. So a re-plan never waits behind a
study's candidates, and a small POST /plans (the request pool) never waits behind either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.db.models import PlanJobRow, StudyRow
from api.metrics import series as job_metrics
from api.services import plan_jobs as plan_job_service
from api.services import studies as study_service
from api.services.job_rows import JobEnd
from api.services.search_pool import SearchPool

RunJob = Callable[..., JobEnd]
"""run(session_factory, job_id, *, search_pool, stopping, take_over=False) -> JobEnd"""


@dataclass(frozen=True)
class JobKind:
    name: str
    """For people and logs: `study`, `plan job`."""
    table: Any
    """The ORM class whose rows are the jobs (state, attempts, heartbeat_at, ...)."""
    run: RunJob
    task: str
    """The procrastinate task's name."""
    queue: str
    """The procrastinate queue its jobs wait in."""
    lock_prefix: str
    """`<lock_prefix>:<id>` locks a job of one row: one waiting and one running at a time."""
    kwarg: str
    """The task's one argument: the row's id."""

    def lock(self, job_id: int) -> str:
        return f"{self.lock_prefix}:{job_id}"

    def run_job(self, session_factory: sessionmaker[Session], job_id: int, *, search_pool: SearchPool,
                stopping: threading.Event, take_over: bool = False) -> JobEnd:
        started = time.perf_counter()
        end = self.run(session_factory, job_id, search_pool=search_pool, stopping=stopping,
                       take_over=take_over)
        if end is JobEnd.finished:  # a run stopped for a shutdown is not a job's duration
            job_metrics.observe_job(kind=self.name, state=self.state_of(session_factory, job_id),
                                    seconds=time.perf_counter() - started)
        return end

    def state_of(self, session_factory: sessionmaker[Session], job_id: int) -> str:
        """The state a job's row is in (`deleted` when the row is gone)."""
        with session_factory() as session:
            return session.scalar(select(self.table.state).where(self.table.id == job_id)) or "deleted"


STUDIES = JobKind(name="study", table=StudyRow, run=study_service.run_study_job,
                  task="fsdp_planner.run_study", queue="studies", lock_prefix="study", kwarg="study_id")
PLAN_JOBS = JobKind(name="plan job", table=PlanJobRow, run=plan_job_service.run_plan_job,
                    task="fsdp_planner.run_plan_job", queue="plans", lock_prefix="plan-job",
                    kwarg="plan_job_id")
KINDS = (STUDIES, PLAN_JOBS)
