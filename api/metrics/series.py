"""The service's Prometheus series, declared once: what the request middleware, the plan service, the
search pool and the job engines record (the job queue's depth is read from the database at scrape time:
api/metrics/job_queue.py).

Plans, searches and jobs are always recorded (a dictionary look-up and an addition each); with
`Settings.metrics` off nothing serves them, and requests are not timed at all (no middleware). Under
`serve --workers N` every web process writes its values to files in `PROMETHEUS_MULTIPROC_DIR`
(prometheus_client's multiprocess mode, set up by api/web_supervisor.py), and a scrape of any of them
adds up all of them (api/metrics/endpoint.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's series (the default registry's process and platform series are left out: under
several web processes they would describe one process at random)."""
PREFIX = "fsdp_planner"

# Plan requests take up to the search deadline (30 s by default); downloads and pages milliseconds.
REQUEST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SEARCH_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
# A plan job is one large search; a study runs one search per candidate, for minutes to hours.
JOB_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)

HTTP_REQUESTS = Counter(
    f"{PREFIX}_http_requests", "HTTP requests answered, by method, route template and status class",
    ["method", "route", "status"], registry=REGISTRY,
)
HTTP_REQUEST_SECONDS = Histogram(
    f"{PREFIX}_http_request_duration_seconds",
    "Seconds from a request's arrival to the end of its response, by method, route template and status class",
    ["method", "route", "status"], buckets=REQUEST_BUCKETS_S, registry=REGISTRY,
)
PLANS = Counter(
    f"{PREFIX}_plans",
    "Plan requests (POST /plans, the dashboard's form, plan jobs; re-plans as kind=replan) by outcome: "
    "new (searched and stored), cached (the same inputs were stored: no search), replayed (an "
    "Idempotency-Key's earlier answer), refused (4xx: nothing fits, the deadline, bad inputs), failed (5xx)",
    ["kind", "outcome"], registry=REGISTRY,
)
SEARCH_SECONDS = Histogram(
    f"{PREFIX}_plan_search_duration_seconds",
    "Seconds a plan or re-plan search took in the search pool (a wait for a free search process "
    "included), by outcome: planned, refused (the planner said why: nothing fits, the deadline), failed "
    "(the search process died)",
    ["outcome"], buckets=SEARCH_BUCKETS_S, registry=REGISTRY,
)
JOB_SECONDS = Histogram(
    f"{PREFIX}_job_duration_seconds",
    "Seconds one run of a job took (studies, plan jobs), observed by the process that ran it when the "
    "job ended, by kind and the state it ended in (succeeded, failed, cancelled; deleted when its row "
    "is gone)",
    ["kind", "state"], buckets=JOB_BUCKETS_S, registry=REGISTRY,
)



def count_plan(*, kind: str, status: int, replayed: bool = False) -> None:
    """Count one plan request that ended with `status`: 201 new, 200 cached (or `replayed`), 4xx refused,
    5xx failed."""
    if status >= 500:
        outcome = "failed"
    elif replayed:
        outcome = "replayed"
    elif status == 201:
        outcome = "new"
    elif status < 300:
        outcome = "cached"
    else:
        outcome = "refused"
    PLANS.labels(kind=kind, outcome=outcome).inc()


def observe_search(*, outcome: str, seconds: float) -> None:
    SEARCH_SECONDS.labels(outcome=outcome).observe(seconds)


def job_kind_label(name: str) -> str:
    """A job kind's label value (`study`, `plan_job`) from its name (api/services/job_kinds.py)."""
    return name.replace(" ", "_")


def observe_job(*, kind: str, state: str, seconds: float) -> None:
    """One run of a job of `kind` (its JobKind name) that ended in `state`."""
    JOB_SECONDS.labels(kind=job_kind_label(kind), state=state).observe(seconds)
