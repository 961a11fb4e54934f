"""The dashboard: server-rendered pages over the same database and services as the JSON API.

`install(app)` adds the pages at `/`, their static files at `/static`, and HTML error pages for
browsers (API clients keep getting problem JSON).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from api.dashboard.pages import router
from api.dashboard.rendering import STATIC_DIR, STATIC_PREFIX, handle_http_exception


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    api_handler: Any = app.exception_handlers[StarletteHTTPException]

    async def http_exception(request: Request, exc: Exception) -> Response:
        return await handle_http_exception(request, exc, api_handler)

    app.add_exception_handler(StarletteHTTPException, http_exception)
