"""Prometheus metrics of the service: the series (series.py), the request middleware (requests.py), the
job queue read from the database at scrape time (job_queue.py) and the `/metrics` endpoint (endpoint.py).

Nothing is imported here: the plan service and the job engines import `api.metrics.series` alone, and
the supervisor of `serve --workers N` (api/web_supervisor.py) this package's one constant.
"""

MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where prometheus_client's multiprocess mode keeps each process's values: set, when prometheus_client is
imported, for every web process of `serve --workers N`, so that a scrape adds them all up."""
