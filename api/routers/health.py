"""Liveness (/healthz: the process answers) and readiness (/readyz: the database answers, schema current)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.db import migrate
from api.problems import ProblemError
from api.routers.responses import problems
from api.schemas.health import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses=problems(503), summary="The database is reachable")
def readyz(request: Request) -> Readiness:
    engine = request.app.state.engine
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        revision = migrate.current_revision(engine)
    except SQLAlchemyError as exc:
        raise ProblemError(
            503, f"cannot reach the database ({type(exc).__name__}); check DATABASE_URL and that the "
            "database server is up", slug="database-unavailable", title="Database unavailable",
            headers={"Retry-After": "5"},
        ) from None
    head = migrate.head_revision()
    if revision != head:
        raise ProblemError(
            503, f"the database schema is at revision {revision}, the code needs {head}; "
            "run `fsdp-planner db upgrade`", slug="database-not-migrated", title="Database not migrated",
            headers={"Retry-After": "5"},
        )
    return Readiness(status="ready", database=engine.dialect.name, schema_revision=revision)
