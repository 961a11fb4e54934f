"""`GET /metrics`: the series in Prometheus's text format (OpenMetrics when the scraper asks for it).

A read like the others: open unless `require_key_for_reads` is set, then it needs a key like every GET
(Prometheus sends it with `authorization: {credentials_file: ...}`). Under `serve --workers N` the answer
adds up every web process's values, whichever process answers (prometheus_client's multiprocess mode:
api/web_supervisor.py gives the processes one `PROMETHEUS_MULTIPROC_DIR`).
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from api.deps import ReadAccess
from api.metrics import MULTIPROCESS_DIR_ENV, series
from api.metrics.job_queue import JobQueueCollector
from api.metrics.requests import RequestMetricsMiddleware

PATH = "/metrics"


def install(app: FastAPI) -> None:
    """Serve `/metrics` and count every request; call after the other middleware, so that this one is
    outside them all and sees their answers too."""
    app.add_middleware(RequestMetricsMiddleware, router=app.router)
    app.add_api_route(PATH, metrics, methods=["GET"], include_in_schema=False, dependencies=[ReadAccess])


def metrics(request: Request) -> Response:
    """Sync: the job counts are database queries, run in FastAPI's thread pool."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encoder(scrape_registry(request))
    # A scrape is a reading of now: no cache may answer the next one.
    return Response(body, media_type=content_type, headers={"Cache-Control": "no-store"})


def scrape_registry(request: Request) -> CollectorRegistry:
    """This scrape's series: every web process's (multiprocess mode) or this one's, and the job queue."""
    registry = CollectorRegistry()
    if os.environ.get(MULTIPROCESS_DIR_ENV):
        MultiProcessCollector(registry)
    else:
        registry.register(series.REGISTRY)
    registry.register(JobQueueCollector(request.app.state.session_factory))
    return registry
