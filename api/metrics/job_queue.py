"""The job queue's depth, counted in the database when Prometheus scrapes: the jobs' tables are the queue
(api/services/job_rows.py), shared by every web process and worker, so the count is right whatever the
job engine and however many processes there are (no process has to keep a gauge up to date)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from api.metrics.series import PREFIX, job_kind_label
from api.services.job_kinds import KINDS
from api.services.job_rows import QUEUED, RUNNING

log = logging.getLogger(__name__)
STATES = (QUEUED, RUNNING)


class JobQueueCollector(Collector):
    """`fsdp_planner_jobs{kind, state}`: studies and plan jobs queued and running (one indexed count per
    kind), and `fsdp_planner_database_up`: whether those counts could be read."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.session_factory = session_factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            f"{PREFIX}_jobs", "Jobs (studies, plan jobs) waiting to run (queued) and running, counted in "
            "the database at scrape time", labels=["kind", "state"],
        )
        try:
            with self.session_factory() as session:
                for kind in KINDS:
                    table = kind.table
                    counts = dict(session.execute(
                        select(table.state, func.count()).where(table.state.in_(STATES)).group_by(table.state)
                    ).all())
                    for state in STATES:
                        jobs.add_metric([job_kind_label(kind.name), state], counts.get(state, 0))
        except SQLAlchemyError as exc:
            # The other series are still worth a scrape; the gauge below says why this one is missing.
            log.warning("metrics: cannot count the jobs (%s)", type(exc).__name__)
            up = 0.0
        else:
            up = 1.0
            yield jobs
        yield GaugeMetricFamily(f"{PREFIX}_database_up",
                                "1 when the scrape could read the job counts from the database, else 0",
                                value=up)
