"""What every kind of job shares: its row is the job (studies, plan jobs). A row in state `queued` waits;
a job claims it (`queued -> running`, numbering the attempt), says it is alive (`heartbeat_at`), and ends
it (`succeeded` or `failed`). These helpers work on any table with those columns, so that the job engines
(api/services/jobs.py in-process, api/services/task_engine.py on procrastinate) run every kind alike.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from api.db.base import utcnow
from api.db.inserts import insert_unless_taken
from api.problems import ProblemError
from api.services.plans import KeyClaim, key_reused

QUEUED = "queued"
RUNNING = "running"
FAILED = "failed"


class JobEnd(enum.Enum):
    """How a job's run ended."""

    not_claimed = "not_claimed"
    """The row was not there to run: cancelled, deleted, finished, or run by another job."""
    finished = "finished"
    """The job succeeded or failed (its row says which), or was cancelled or deleted while it ran."""
    requeued = "requeued"
    """Stopped by `stopping` (its process is shutting down): queued again, for the next job."""


def beat(session: Session, table: Any, job_ids: Collection[int]) -> None:
    """Say that this process still runs these jobs."""
    if job_ids:
        session.execute(update(table).where(table.id.in_(job_ids), table.state == RUNNING)
                        .values(heartbeat_at=utcnow()))
    session.commit()


def requeue_stale(session: Session, table: Any, *, stale_after_s: float) -> list[int]:
    """Queue again the running jobs whose process has been silent for `stale_after_s` (killed, or its
    machine gone): their ids. One UPDATE: of several processes doing this at once, one gets each job;
    the silent one, should it wake, can no longer write (its attempt is over)."""
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    ids = session.scalars(update(table).where(table.state == RUNNING, table.heartbeat_at < cutoff)
                          .values(state=QUEUED, started_at=None).returning(table.id)).all()
    session.commit()
    return sorted(ids)


def give_up(session: Session, table: Any, job_id: int, reason: str) -> bool:
    """Fail a queued or running job that will not run again (its processes kept dying); whether it was
    unfinished. The attempt that may still be running can store nothing after this."""
    failed = session.execute(update(table).where(table.id == job_id, table.state.in_((QUEUED, RUNNING)))
                             .values(state=FAILED, error=reason, finished_at=utcnow())
                             .returning(table.id)).first()
    session.commit()
    return failed is not None


def queued(session: Session, table: Any) -> list[int]:
    """Ids of the jobs waiting to run, oldest first (resubmitted when a web process starts)."""
    ids = session.scalars(select(table.id).where(table.state == QUEUED).order_by(table.id)).all()
    session.commit()
    return list(ids)


def keyed_job(session: Session, table: Any, claim: KeyClaim) -> int | None:
    """The job `claim`'s key named while it was fresh (a 422 problem for another request), or None
    while the key is free."""
    remembered = session.execute(select(table.id, table.request_fingerprint).where(
        table.idempotency_key == claim.key, table.created_at >= claim.cutoff()
    )).first()
    if remembered is None:
        return None
    if remembered.request_fingerprint != claim.fingerprint:
        raise key_reused()
    return remembered.id


def store_queued(
    session: Session, table: Any, values: dict[str, Any], claim: KeyClaim | None,
    enqueue: Callable[[Session, int], None] | None,
) -> tuple[int, bool]:
    """Store a queued job row with `values` and hand it to the task engine (`enqueue`, in the same
    transaction), then commit: (its id, False). With `claim`, the key is taken atomically (a row that
    held it past its lifetime lets it go first: the row stays, the key does not); when another process
    took it first, that request's job is the answer: (its id, True), nothing stored."""
    if claim is not None:
        session.execute(update(table).where(
            table.idempotency_key == claim.key, table.created_at < claim.cutoff()
        ).values(idempotency_key=None))
    values = {
        **values, "state": QUEUED, "attempts": 0, "created_at": utcnow(),
        "idempotency_key": None if claim is None else claim.key,
        "request_fingerprint": None if claim is None else claim.fingerprint,
    }
    if claim is None:
        job_id = session.scalar(insert(table).values(**values).returning(table.id))
    else:
        job_id = insert_unless_taken(session, table, values, unique="idempotency_key")
    if job_id is None:  # another process claimed the key first: answer as it did
        session.rollback()
        assert claim is not None
        replayed = keyed_job(session, table, claim)
        if replayed is None:
            raise ProblemError(409, "this Idempotency-Key was being claimed by another request; send the "
                               "request again", slug="concurrent-change", title="Concurrent change")
        return replayed, True
    if enqueue is not None:
        enqueue(session, job_id)
    session.commit()
    return job_id, False
