"""A `fsdp-planner worker`'s own metrics endpoint: with the procrastinate engine its jobs (and the plans
and searches they make) run in the worker, not in a web process, so Prometheus scrapes it as well."""

from __future__ import annotations

from prometheus_client import start_http_server

from api.metrics import series


def serve_metrics(*, host: str, port: int) -> None:
    """This process's series at `http://host:port/metrics`, from a daemon thread of prometheus_client's
    (the job queue's depth stays with the web processes: it is one number for the whole fleet)."""
    start_http_server(port, addr=host, registry=series.REGISTRY)
