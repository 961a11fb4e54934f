"""Service commands: `serve`, `worker`, `db upgrade|downgrade|current`, `keys create|list|revoke`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from api.cli.common import TCP_PORT, whole_number
from api.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url", envvar="DATABASE_URL", show_envvar=True,
        help="SQLAlchemy URL, e.g. postgresql://user:pass@host/db (default: a SQLite file in ./data).",
    ),
]


def _settings(database_url: str | None) -> Settings:
    return Settings(database_url=database_url) if database_url else Settings()


def _engine(database_url: str | None) -> Engine:
    # Imports stay inside the commands so that `fsdp-planner --help` starts fast.
    from api.db.session import create_db_engine

    return create_db_engine(_settings(database_url).resolved_database_url, pool_size=1, max_overflow=0)


def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(
        parser=TCP_PORT, help="Port to listen on.",
    )] = 8000,
    database_url: DatabaseUrlOption = None,
    workers: Annotated[int, typer.Option(
        parser=whole_number(unit="processes", low=1), help="Worker processes (each plans in threads).",
    )] = 1,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the API (migrates the database first); OpenAPI docs at /docs."""
    import uvicorn

    settings = _settings(database_url)
    console.print(
        f"fsdp-planner on http://{host}:{port} (docs: /docs), database: "
        f"{_display_url(settings.resolved_database_url)}, studies and plan jobs: "
        + ("procrastinate jobs for `fsdp-planner worker` processes" if settings.job_engine == "procrastinate"
           else "run in this server")
    )
    if workers == 1:
        from api.app import create_app

        uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, proxy_headers=True)
        return
    # Several workers import the app by name and read the settings from the environment. Migrate once
    # here: workers migrating a SQLite file side by side would race to create the same tables.
    import os
    import sys

    if database_url:
        os.environ["DATABASE_URL"] = database_url
    if settings.migrate_on_startup:
        db_upgrade(revision="head", database_url=settings.resolved_database_url)
        os.environ["FSDP_PLANNER_MIGRATE_ON_STARTUP"] = "false"
    if settings.search_workers is None:
        from api.services.search_pool import available_cores

        # Each web process has its own search pool: share the cores among them.
        os.environ["FSDP_PLANNER_SEARCH_WORKERS"] = str(max(1, available_cores() // workers))
    # The supervisor runs as a process of its own main module, so that the web processes it spawns
    # import only what they need to answer its health checks (api/web_supervisor.py says why); exec
    # keeps this pid, which is what a service manager or a test holds.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [
        sys.executable, "-m", "api.web_supervisor", "--host", host, "--port", str(port),
        "--workers", str(workers), "--log-level", log_level,
    ])


def worker(
    database_url: DatabaseUrlOption = None,
    concurrency: Annotated[int | None, typer.Option(
        parser=whole_number(unit="studies", low=1, high=64),
        help="Studies this worker runs at once (default: FSDP_PLANNER_STUDY_JOBS, 1); their "
        "searches share FSDP_PLANNER_STUDY_SEARCH_WORKERS processes (default: one per core).",
    )] = None,
    name: Annotated[str | None, typer.Option(
        help="The worker's name in the logs (default: host:pid).")] = None,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
    metrics_port: Annotated[int | None, typer.Option(
        parser=TCP_PORT,
        help="Serve this worker's Prometheus metrics (job durations, and the plans and searches of its "
        "plan jobs) at http://METRICS_HOST:METRICS_PORT/metrics (default: not served).",
    )] = None,
    metrics_host: Annotated[str, typer.Option(help="Interface of --metrics-port.")] = "127.0.0.1",
) -> None:
    """Run study jobs and plan jobs (large plan searches, re-plans; procrastinate on PostgreSQL) for API
    servers started with FSDP_PLANNER_JOB_ENGINE=procrastinate: start any number, on any machine, with
    the same DATABASE_URL. Each kind has its own queue, slots and search processes.
    SIGTERM/SIGINT put the running studies back in the queue for another worker; the jobs of a worker
    killed outright are retried by another one once it has been silent FSDP_PLANNER_STUDY_STALE_AFTER_S."""
    import asyncio
    import logging
    import os
    import socket

    from api.db import migrate
    from api.db.session import create_db_engine, create_session_factory
    from api.services.search_pool import SearchPool, available_cores
    from api.services.task_engine import StudyWorker

    settings = _settings(database_url)
    url = settings.resolved_database_url
    if not url.startswith("postgresql"):
        err_console.print("error: `fsdp-planner worker` needs a PostgreSQL DATABASE_URL (the jobs live "
                          "there); with SQLite the API runs studies itself (`fsdp-planner serve`)",
                          highlight=False)
        raise typer.Exit(2)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    jobs = concurrency or settings.study_jobs
    engine = create_db_engine(url, pool_size=jobs + 2, max_overflow=4)
    search_pool = SearchPool(workers=settings.study_search_workers or available_cores(),
                             deadline_s=settings.search_deadline_s)
    try:
        if settings.migrate_on_startup:
            migrate.upgrade(engine)
        current, head = migrate.current_revision(engine), migrate.head_revision()
        if current != head:
            err_console.print(f"error: the database is at schema revision {current}, this worker needs "
                              f"{head}; run `fsdp-planner db upgrade` (or start the API) first",
                              highlight=False)
            raise typer.Exit(1)
        name = name or f"{socket.gethostname()}:{os.getpid()}"
        console.print(f"fsdp-planner worker {name}: {jobs} studies at once, {search_pool.workers} search "
                      f"processes; {settings.plan_jobs} plan jobs (large plans, re-plans) at once; "
                      f"database {_display_url(url)}", highlight=False)
        search_pool.start()
        if metrics_port is not None:
            from api.metrics.worker import serve_metrics

            try:
                serve_metrics(host=metrics_host, port=metrics_port)
            except OSError as exc:
                err_console.print(f"error: cannot serve metrics on {metrics_host}:{metrics_port} "
                                  f"({exc.strerror}); choose another --metrics-port", highlight=False)
                raise typer.Exit(2) from None
        study_worker = StudyWorker(
            url, create_session_factory(engine), search_pool=search_pool, concurrency=jobs,
            stale_after_s=settings.study_stale_after_s, name=name,
            plan_search_pool=SearchPool(workers=settings.plan_jobs, deadline_s=settings.search_deadline_s),
            plan_concurrency=settings.plan_jobs,
        )
        asyncio.run(study_worker.run())
    finally:
        search_pool.shutdown()
        engine.dispose()


db_app = typer.Typer(help="Database schema migrations (Alembic).", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    database_url: DatabaseUrlOption = None,
) -> None:
    """Migrate the database up (to the newest schema by default)."""
    from api.db import migrate

    engine = _engine(database_url)
    try:
        migrate.upgrade(engine, revision)
        revision = migrate.current_revision(engine)
        console.print(f"database {_display_url(str(engine.url))} at revision {revision}")
    finally:
        engine.dispose()


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision; `base` drops every table.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Migrate the database down to REVISION. Refused, changing nothing, where it would delete rows,
    unless FSDP_PLANNER_FORCE_DATA_LOSS=1 is set."""
    from api.db import migrate
    from migrations.data_loss import DataLossRefusedError

    engine = _engine(database_url)
    try:
        migrate.downgrade(engine, revision)
        console.print(f"database at revision {migrate.current_revision(engine)}")
    except DataLossRefusedError as exc:
        err_console.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None
    finally:
        engine.dispose()


@db_app.command("current")
def db_current(database_url: DatabaseUrlOption = None) -> None:
    """Print the database's schema revision and the newest one this code ships."""
    from api.db import migrate

    engine = _engine(database_url)
    try:
        console.print(f"current: {migrate.current_revision(engine)}  head: {migrate.head_revision()}")
    finally:
        engine.dispose()


keys_app = typer.Typer(help="API keys for writes (POST/DELETE); once one exists, writes need one.",
                       no_args_is_help=True)


def _key_session(database_url: str | None) -> tuple[Engine, Session]:
    from api.db import migrate
    from api.db.session import create_session_factory

    engine = _engine(database_url)
    migrate.upgrade(engine)
    return engine, create_session_factory(engine)()


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Argument(help="Who or what uses the key, e.g. ci or alice.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    from api.keys import ApiKeyError, create_key

    engine, session = _key_session(database_url)
    try:
        issued = create_key(session, name)
    except ApiKeyError as exc:
        err_console.print(f"error: {exc}")
        raise typer.Exit(1) from None
    finally:
        session.close()
        engine.dispose()
    err_console.print(
        f"created key {issued.row.id} ({issued.row.name}); store it now, it is not shown again:",
        highlight=False,
    )
    print(issued.key)  # alone on stdout, so `KEY=$(fsdp-planner keys create ci)` works


@keys_app.command("list")
def keys_list(database_url: DatabaseUrlOption = None) -> None:
    """List keys (prefix, status); never the keys themselves."""
    from api.keys import list_keys

    engine, session = _key_session(database_url)
    try:
        rows = list_keys(session)
    finally:
        session.close()
        engine.dispose()
    table = Table("id", "name", "prefix", "created (UTC)", "status")
    for row in rows:
        status = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
        created = f"{row.created_at:%Y-%m-%d %H:%M}"
        table.add_row(str(row.id), row.name, f"fsdpk_{row.prefix}_…", created, status)
    console.print(table if rows else "no API keys: writes are open to anyone who can reach the server")


@keys_app.command("revoke")
def keys_revoke(
    id_or_name: Annotated[str, typer.Argument(metavar="ID|NAME", help="Key id, or an active key's name.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Revoke a key: requests using it get 401 from now on."""
    from api.keys import ApiKeyError, any_active_key, revoke_key

    engine, session = _key_session(database_url)
    try:
        row = revoke_key(session, id_or_name)
        still_locked = any_active_key(session)
    except ApiKeyError as exc:
        err_console.print(f"error: {exc}")
        raise typer.Exit(1) from None
    finally:
        session.close()
        engine.dispose()
    console.print(f"revoked key {row.id} ({row.name})")
    if not still_locked:
        console.print("no active keys remain: writes are open again")


def _display_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("worker")(worker)
    app.add_typer(db_app, name="db")
    app.add_typer(keys_app, name="keys")
