"""The FastAPI application factory: settings, database, middleware, problem handlers, routers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.cross_site import SAFE_METHODS, CrossSiteMiddleware
from api.dashboard import install as install_dashboard
from api.dashboard.vendor import install as install_plotly
from api.db import migrate
from api.db.session import create_db_engine, create_session_factory
from api.docs import install as install_docs
from api.lifeline import stop_in_order_with_parent
from api.metrics.endpoint import install as install_metrics
from api.middleware import AllowedMethodsMiddleware, BodySizeLimitMiddleware
from api.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers
from api.routers import api_router, health
from api.services.job_kinds import PLAN_JOBS, STUDIES
from api.services.jobs import InProcessJobs
from api.services.keyed_locks import KeyedLocks
from api.services.search_pool import SearchPool, available_cores
from api.services.search_shares import SearchShares
from api.services.task_engine import ProcrastinateJobs
from api.settings import Settings
from api.text_check import TextCheckMiddleware
from planner import __version__

API_PREFIX = "/api/v1"
PLANNING_THREADS = 16
"""Plan requests in progress per web process (waiting on the search pool, or storing); more wait for
a turn without holding a thread. A plan holds no database connection while its search runs."""
SEARCH_SHARE_RETRY_AFTER_S = 2
"""The `Retry-After` of a 429 for a client past its share of the search pool: most searches take under a
second; a client whose own searches take longer is told again."""
log = logging.getLogger(__name__)

DESCRIPTION = """\
Plans FSDP sharding, wrap units, communication buckets, activation checkpointing, micro-batching and
torch.compile for a model on a GPU cluster, and stores every plan.

Errors are `application/problem+json` (RFC 9457). Writes need `Authorization: Bearer <key>` once an
API key exists (`fsdp-planner keys create NAME`).
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """A configured app; the database engine is created now, migrations run at start-up."""
    settings = settings or Settings()
    engine = create_db_engine(
        settings.resolved_database_url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
    )

    search_pool = SearchPool(workers=settings.search_workers or available_cores(),
                             deadline_s=settings.search_deadline_s)
    # Studies search in a pool of their own: a plan request never queues behind a study's candidates.
    # With the procrastinate engine they run in `fsdp-planner worker` processes, not here at all.
    # Large plan searches and re-plans are jobs too, run the same way, with job threads and a search
    # pool (`plan_jobs` processes) of their own: they never wait behind a study, nor a small plan behind them.
    jobs: InProcessJobs | ProcrastinateJobs
    plan_jobs: InProcessJobs | ProcrastinateJobs
    if settings.job_engine == "procrastinate":
        jobs = ProcrastinateJobs(STUDIES)
        plan_jobs = ProcrastinateJobs(PLAN_JOBS)
    else:
        jobs = InProcessJobs(
            create_session_factory(engine), threads=settings.study_jobs,
            stale_after_s=settings.study_stale_after_s,
            search_pool=SearchPool(workers=settings.study_search_workers or available_cores(),
                                   deadline_s=settings.search_deadline_s),
        )
        plan_jobs = InProcessJobs(
            create_session_factory(engine), threads=settings.plan_jobs, kind=PLAN_JOBS,
            stale_after_s=settings.study_stale_after_s,
            search_pool=SearchPool(workers=settings.plan_jobs, deadline_s=settings.search_deadline_s),
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_startup:
            await anyio.to_thread.run_sync(migrate.upgrade, engine)
            log.info("database %s at schema revision %s", engine.url, migrate.head_revision())
        # A web process of `serve --workers N` has had SIGKILL for its supervisor's death so far; from here
        # on it has a pool and requests to stop in order.
        stop_in_order_with_parent()
        await anyio.to_thread.run_sync(search_pool.start)
        await anyio.to_thread.run_sync(jobs.start)
        await anyio.to_thread.run_sync(plan_jobs.start)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(plan_jobs.shutdown)
            await anyio.to_thread.run_sync(jobs.shutdown)
            await anyio.to_thread.run_sync(search_pool.shutdown)
            engine.dispose()

    app = FastAPI(
        title="fsdp-planner",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # api.docs serves /docs from local assets (no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = create_session_factory(engine)
    app.state.plan_locks = KeyedLocks()
    app.state.search_pool = search_pool
    app.state.search_shares = SearchShares(
        share=settings.search_share or max(1, search_pool.workers // 2), wait_s=settings.search_share_wait_s,
        retry_after_s=SEARCH_SHARE_RETRY_AFTER_S,
    )
    app.state.jobs = jobs
    app.state.plan_jobs = plan_jobs
    # Threads that wait on the search pool, apart from the default pool's (api/deps.py run_planning).
    app.state.planning_threads = anyio.CapacityLimiter(PLANNING_THREADS)

    # Inside the size limit (added first, it runs last): it reads bodies the limit has already bounded.
    app.add_middleware(TextCheckMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AllowedMethodsMiddleware, router=app.router)
    # Outside the others: another site's write is refused before its body or key is looked at.
    app.add_middleware(CrossSiteMiddleware, prefix=f"{API_PREFIX}/")
    install_problem_handlers(app)  # also catches what the middleware above raises
    if settings.metrics:
        install_metrics(app)  # outermost: counts every answer, the problem handlers' 500s included

    app.include_router(api_router, prefix=API_PREFIX)
    # Probes conventionally hit the root paths; same handlers, documented once under /api/v1.
    app.include_router(health.router, include_in_schema=False)
    # /docs with Swagger UI from /static/swagger-ui, and the built guide at /docs/guide: before the
    # dashboard's /static
    install_docs(app, guide_dir=settings.docs_site_dir)
    install_plotly(app)  # plotly.js from the plotly package: before the dashboard's /static
    install_dashboard(app)  # server-rendered pages at /, static files at /static
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


CROSS_SITE_RESPONSE = {
    "description": "Sent by another site's page (Sec-Fetch-Site, else Origin against Host): nothing was done",
    "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
}


LINKS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    # (method, path, status) of a response -> its OpenAPI links: what a client can do next with the row
    # it names. Targets are written as (method, path) and resolved to their operationId below.
    ("post", "/api/v1/calibrations", "201"): {
        "GetCalibration": {"operation": ("get", "/api/v1/calibrations/{calibration_id}"),
                           "parameters": {"calibration_id": "$response.body#/id"}},
        "DeleteCalibration": {"operation": ("delete", "/api/v1/calibrations/{calibration_id}"),
                              "parameters": {"calibration_id": "$response.body#/id"}},
        "PlanWithCalibration": {"operation": ("post", "/api/v1/plans"),
                                "requestBody": {"calibration_id": "$response.body#/id"}},
        "ListCalibrations": {"operation": ("get", "/api/v1/calibrations")},
    },
    ("get", "/api/v1/calibrations", "200"): {
        "GetNewestCalibration": {"operation": ("get", "/api/v1/calibrations/{calibration_id}"),
                                 "parameters": {"calibration_id": "$response.body#/items/0/id"}},
    },
    ("get", "/api/v1/calibrations/{calibration_id}", "200"): {
        "DeleteCalibration": {"operation": ("delete", "/api/v1/calibrations/{calibration_id}"),
                              "parameters": {"calibration_id": "$response.body#/id"}},
    },
    **{
        ("post", "/api/v1/plans", status): {
            "GetPlan": {"operation": ("get", "/api/v1/plans/{plan_id}"),
                        "parameters": {"plan_id": "$response.body#/id"}},
            "AddRun": {"operation": ("post", "/api/v1/plans/{plan_id}/runs"),
                       "parameters": {"plan_id": "$response.body#/id"}},
            "ListRuns": {"operation": ("get", "/api/v1/plans/{plan_id}/runs"),
                         "parameters": {"plan_id": "$response.body#/id"}},
        }
        for status in ("200", "201")
    },
    ("post", "/api/v1/plans/{plan_id}/runs", "201"): {
        "ListRuns": {"operation": ("get", "/api/v1/plans/{plan_id}/runs"),
                     "parameters": {"plan_id": "$response.body#/plan_id"}},
        "AddRun": {"operation": ("post", "/api/v1/plans/{plan_id}/runs"),
                   "parameters": {"plan_id": "$response.body#/plan_id"}},
        "GetPlan": {"operation": ("get", "/api/v1/plans/{plan_id}"),
                    "parameters": {"plan_id": "$response.body#/plan_id"}},
    },
}


def _links(paths: dict[str, Any]) -> None:
    """Adds LINKS to the responses of `paths`, each target named by its operationId."""
    for (method, path, status), links in LINKS.items():
        response = paths[path][method]["responses"][status]
        response["links"] = {
            name: {"operationId": paths[link["operation"][1]][link["operation"][0]]["operationId"],
                   **{key: value for key, value in link.items() if key != "operation"}}
            for name, link in links.items()
        }


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with error responses declared as application/problem+json and LINKS from a
    created row to what reads and extends it.

    Reads are documented without security unless `require_key_for_reads` is set, as they are served.
    """
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        open_reads = not app.state.settings.require_key_for_reads
        for path in schema.get("paths", {}).values():
            for method, operation in path.items():
                if open_reads and method == "get":
                    operation.pop("security", None)
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if status[0] in "45" and "application/json" in content:
                        content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
                if method.upper() not in SAFE_METHODS:  # answered by api/cross_site.py before the route
                    operation.setdefault("responses", {}).setdefault("403", CROSS_SITE_RESPONSE)
        _links(schema.get("paths", {}))
        app.openapi_schema = schema
    return app.openapi_schema
