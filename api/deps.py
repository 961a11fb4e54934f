"""FastAPI dependencies and their `Annotated` aliases: settings, database session, API-key access; and
`run_planning`, the thread pool of plan creation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, TypeVar

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from api import keys
from api.db.models import ApiKeyRow
from api.problems import ProblemError
from api.settings import Settings

T = TypeVar("T")


async def run_planning(request: Request, func: Callable[..., T], *args: object) -> T:
    """Run a sync call that may wait on the search pool (plan creation) in a worker thread of the
    app's own planning limiter: however many requests wait for a search, the default thread pool
    that serves every other endpoint keeps its threads."""
    return await anyio.to_thread.run_sync(func, *args, limiter=request.app.state.planning_threads)


@asynccontextmanager
async def search_share(request: Request) -> AsyncIterator[None]:
    """Hold one of the requesting client's share of the search pool for the block (a 429 problem when
    it stays full: api/services/search_shares.py). The client is the API key that authorised the request
    (`require_write_access`, or the dashboard's form check), or its address when there was none."""
    key_id = getattr(request.state, "api_key_id", None)
    if key_id is not None:
        client, described = f"key {key_id}", f"API key {key_id}"
    else:
        # Behind a proxy this is the proxy's address unless uvicorn reads X-Forwarded-For
        # (`--forwarded-allow-ips`): anonymous clients would then share one share.
        host = request.client.host if request.client else "unknown"
        client, described = f"address {host}", f"this client address ({host})"
    async with request.app.state.search_shares.held(client, described=described):
        yield


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for one request, used by the sync endpoints in worker threads.

    Opened and closed on the event loop: closing from a worker thread would need a free thread while the
    session still holds a pooled connection, and under load every thread can be waiting for a connection
    (a deadlock until the pool times out).
    """
    session: Session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.close()


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]

# auto_error=False: a missing header is answered by `_authorize` with a problem, not FastAPI's 403.
_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `fsdp-planner keys create NAME`. Needed for writes once any key exists.",
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _authorize(session: Session, credentials: HTTPAuthorizationCredentials | None) -> ApiKeyRow | None:
    try:
        return _check_key(session, credentials)
    finally:
        # Hand the connection back before the endpoint waits for a worker thread (see get_session).
        session.commit()


def _check_key(session: Session, credentials: HTTPAuthorizationCredentials | None) -> ApiKeyRow | None:
    if not keys.any_active_key(session):
        return None
    challenge = {"WWW-Authenticate": 'Bearer realm="fsdp-planner"'}
    if credentials is None:
        raise ProblemError(
            401, "this server requires an API key: send `Authorization: Bearer <key>` "
            "(an administrator creates one with `fsdp-planner keys create NAME`)",
            slug="unauthorized", headers=challenge,
        )
    row = keys.verify_key(session, credentials.credentials)
    if row is None:
        raise ProblemError(
            401, "the API key is unknown or revoked; ask for a new one (`fsdp-planner keys create NAME`)",
            slug="unauthorized", headers={**challenge, "WWW-Authenticate": challenge["WWW-Authenticate"]
                                          + ', error="invalid_token"'},
        )
    return row


def require_write_access(request: Request, session: SessionDep, credentials: BearerDep) -> ApiKeyRow | None:
    """Writes need a valid key once any active key exists (the key then names the client whose share of
    the search pool a search takes: `search_share`)."""
    row = _authorize(session, credentials)
    if row is not None:
        request.state.api_key_id = row.id
    return row


def require_read_access(
    session: SessionDep, settings: SettingsDep, credentials: BearerDep
) -> ApiKeyRow | None:
    """Reads are open unless `require_key_for_reads` is set (then they need a key like writes)."""
    if not settings.require_key_for_reads:
        return None
    return _authorize(session, credentials)


WriteAccess = Depends(require_write_access)
ReadAccess = Depends(require_read_access)
