"""Request counts and latency per route template, from a pure ASGI middleware outside all the others, so
that answers given before routing (a cross-site 403, a 413, an OPTIONS 204) are counted as well."""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.metrics.series import HTTP_REQUEST_SECONDS, HTTP_REQUESTS
from api.middleware import METHODS

UNMATCHED = "<unmatched>"
"""The route label of a path no route serves: raw paths would give every scanner's probe a series."""
OTHER_METHOD = "other"
_KNOWN_METHODS = frozenset({*METHODS, "OPTIONS"})


def flat_routes(router: Router) -> list[BaseRoute]:
    """The router's routes with included routers opened up, each with its whole path (FastAPI 0.16x
    keeps an included router as one route, its routes' paths relative to its prefix; before, the routes
    were copied up with the prefix already)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return list(router.routes)
    return list(iter_route_contexts(router.routes))


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path template of the route the router will choose for this request (`/api/v1/plans/{plan_id}`;
    `/static/{path}` under a mount), else UNMATCHED. Like the router: the first route matching path and
    method, else the first matching the path alone (a 405)."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return _template(route)
        if match is Match.PARTIAL and partial is None:
            partial = route
    return UNMATCHED if partial is None else _template(partial)


def _template(route: BaseRoute) -> str:
    template = getattr(route, "path_format", None)  # the path without convertors: `{plan_id}`
    return template if isinstance(template, str) and template else UNMATCHED


class RequestMetricsMiddleware:
    """Counts every HTTP request and times it to the end of its response, labelled with its method, its
    route template (`route_template`) and its status class (`2xx` ... `5xx`)."""

    def __init__(self, app: ASGIApp, *, router: Router) -> None:
        self.app = app
        self.router = router
        self._routes: list[BaseRoute] | None = None
        """`flat_routes`, once the app serves: every route is added by then."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # Before the app runs: routing rewrites the scope (a mount's root_path) as it goes.
        if self._routes is None:
            self._routes = flat_routes(self.router)
        route = route_template(self._routes, scope)
        status = 500  # an exception that escapes before any response is the server's 500

        async def observing_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            method = scope["method"] if scope["method"] in _KNOWN_METHODS else OTHER_METHOD
            labels = {"method": method, "route": route, "status": f"{status // 100}xx"}
            HTTP_REQUESTS.labels(**labels).inc()
            HTTP_REQUEST_SECONDS.labels(**labels).observe(time.perf_counter() - started)
