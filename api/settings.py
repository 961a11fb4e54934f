"""Service settings: one pydantic-settings class, read from the environment (and an optional .env)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path("data")
DEFAULT_DOCS_SITE_DIR = Path("site")
SQLITE_FILE_NAME = "fsdp-planner.sqlite3"


class Settings(BaseSettings):
    """Everything the service can be configured with; environment names are `FSDP_PLANNER_<FIELD>`.

    `DATABASE_URL` is also read without the prefix, as every hosting platform spells it that way.
    """

    model_config = SettingsConfigDict(
        env_prefix="FSDP_PLANNER_", env_file=".env", extra="ignore", populate_by_name=True
    )

    database_url: Annotated[
        str | None,
        Field(validation_alias=AliasChoices("database_url", "DATABASE_URL", "FSDP_PLANNER_DATABASE_URL")),
    ] = None
    """SQLAlchemy URL; None means a SQLite file in `data_dir`. `postgresql://` URLs use psycopg 3."""
    data_dir: Path = DEFAULT_DATA_DIR
    """Where the embedded SQLite database lives (created on first run)."""
    docs_site_dir: Path = DEFAULT_DOCS_SITE_DIR
    """The documentation site `mkdocs build` writes (`site/` in the checkout), served at /docs/guide;
    relative to the directory the server starts in. Until it is built, /docs/guide says how to build it."""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 5 * 1024 * 1024
    """Request bodies larger than this are refused with 413."""
    max_model_layers: Annotated[int, Field(ge=1)] = 1024
    """Largest block count (or traced layer-graph units) planned; search time grows with the
    distinct ones (identical blocks are priced once)."""
    search_deadline_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """CPU seconds one plan's search may take; past them the request is refused (422
    search-deadline-exceeded). CPU time, so that whether a request fits does not depend on the load."""
    search_workers: Annotated[int | None, Field(ge=1)] = None
    """Processes that run plan searches, per web process; None: one per available core (`serve
    --workers N` shares the cores among its N web processes)."""
    search_share: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Searching requests (plans, a refused batch's advice, the dashboard's batch hint) one client (its API
    key, else its address) may have in progress at once per web process; None: half the search processes
    (at least one), so that no client holds the whole pool."""
    search_share_wait_s: Annotated[float, Field(ge=0, le=3600)] = 30.0
    """How long a request whose client has its share in use waits for room before its 429 (30: as long as
    one search may take by default; the client's requests are then served one after another)."""
    job_engine: Literal["in-process", "procrastinate"] = "in-process"
    """Where studies run. `in-process`: on threads of the web process that accepted them (the embedded
    default, any database). `procrastinate` (PostgreSQL only): each study is a job of the procrastinate
    task engine, deferred in the transaction that stores it and run by `fsdp-planner worker` processes
    (any number, on any machine, same `DATABASE_URL`); the web process runs none."""
    study_jobs: Annotated[int, Field(ge=1, le=64)] = 1
    """Studies run at once per web process (in-process engine) or per `fsdp-planner worker` process
    (procrastinate); more wait in state `queued`."""
    study_search_workers: Annotated[int | None, Field(ge=1)] = None
    """Processes that run the studies' searches, per web process (in-process engine) or per worker
    (procrastinate), apart from the plan requests' pool (so a small plan never waits behind a study);
    None: one per available core."""
    job_threshold_units: Annotated[int, Field(ge=1)] = 256
    """A `POST /plans` whose model has more layer-graph units (or layers) than this is a job (202 and a
    plan job to poll) instead of a synchronous request (201); re-plans are always jobs. 256: a worst-case
    graph (no two units alike) searches in about 0.7 s on one core, 512 in 1.5-1.8 s, 1,024 in 3.1-3.3 s
    (bench: docs/service/jobs.md)."""
    plan_jobs: Annotated[int, Field(ge=1, le=64)] = 1
    """Plan jobs (large plan searches, re-plans) run at once per web process (in-process engine) or per
    `fsdp-planner worker` (procrastinate), each in a search process of their own, apart from the studies'
    and from the plan requests' pools."""
    study_stale_after_s: Annotated[float, Field(ge=1, le=3600)] = 60.0
    """A running study (or plan job) whose process has not said it is alive for this long (killed, or its
    machine gone) is queued again and run from its first candidate by a web process that is alive (in-process
    engine); with procrastinate, the job of a worker silent this long is retried by another worker."""
    require_key_for_reads: bool = False
    """Once API keys exist, also require one for GET requests (writes always need one then)."""
    metrics: bool = True
    """Serve Prometheus metrics at `/metrics` (requests, plans, searches, jobs: docs/service/metrics.md);
    false: no such path (404), and requests are not timed."""
    migrate_on_startup: bool = True
    """Run `alembic upgrade head` when the app starts."""
    idempotency_ttl_s: Annotated[int, Field(ge=60)] = 24 * 3600
    """How long an `Idempotency-Key` is remembered."""
    db_pool_size: Annotated[int, Field(ge=1)] = 10
    """Connections kept open per process (PostgreSQL and SQLite files)."""
    db_max_overflow: Annotated[int, Field(ge=0)] = 30
    """Extra connections allowed under load, above `db_pool_size`."""
    log_level: str = "info"

    @field_validator("database_url")
    @classmethod
    def _psycopg_driver(cls, url: str | None) -> str | None:
        # Hosting platforms hand out `postgres://` / `postgresql://` URLs; the installed driver is psycopg 3.
        if url is None or not url.strip():
            return None
        url = url.strip()
        for scheme in ("postgres://", "postgresql://"):
            if url.startswith(scheme):
                return "postgresql+psycopg://" + url[len(scheme):]
        return url

    @model_validator(mode="after")
    def _engine_needs_postgresql(self) -> Settings:
        if self.job_engine == "procrastinate" and not (self.database_url or "").startswith("postgresql"):
            raise ValueError(
                "FSDP_PLANNER_JOB_ENGINE=procrastinate needs a PostgreSQL DATABASE_URL (its jobs live in "
                "PostgreSQL); with SQLite leave the engine at in-process"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        """The URL to connect to; the default SQLite file's directory is created here."""
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / SQLITE_FILE_NAME).resolve()}"

