"""Request counts and latency per route template, from a pure ASGI middleware outside all the others, so
that answers given before routing (a cross-site 403, a 413, an OPTIONS 204) are counted as well."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.routing import BaseRoute, Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.metrics.series import HTTP_REQUEST_SECONDS, HTTP_REQUESTS
from api.middleware import METHODS

UNMATCHED = "<unmatched>"
"""The route label of a path no route serves: raw paths would give every scanner's probe a series."""
OTHER_METHOD = "other"
_KNOWN_METHODS = frozenset({*METHODS, "OPTIONS"})


@dataclass(frozen=True)
class RoutePattern:
    """A route as the metrics match it: its compiled path, its template and its methods (None: any, as
    for a mount). Matching these is a regex per route, not the router's whole matching machinery (which
    took up to 0.7 ms a request for a path no route serves)."""

    regex: re.Pattern[str]
    template: str
    """The path without convertors: `/api/v1/plans/{plan_id}`, `/static/{path}`."""
    methods: frozenset[str] | None


def route_patterns(router: Router) -> list[RoutePattern | BaseRoute]:
    """The router's routes in its order, included routers opened up (each route with its whole path), as
    RoutePatterns; a route without a path pattern is kept as it is, to match itself."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before 0.16x copied included routes up, with their prefix
        routes: list[BaseRoute] = list(router.routes)
    else:
        routes = list(iter_route_contexts(router.routes))
    patterns: list[RoutePattern | BaseRoute] = []
    for route in routes:
        regex = getattr(route, "path_regex", None)
        template = getattr(route, "path_format", None)
        if isinstance(regex, re.Pattern) and isinstance(template, str) and template:
            methods = getattr(route, "methods", None)
            patterns.append(RoutePattern(regex=regex, template=template,
                                         methods=frozenset(methods) if methods else None))
        else:
            patterns.append(route)
    return patterns


def route_template(patterns: Sequence[RoutePattern | BaseRoute], scope: Scope) -> str:
    """The path template of the route the router will choose for this request, else UNMATCHED. Like the
    router: the first route matching path and method, else the first matching the path alone (a 405)."""
    path = _route_path(scope)
    partial = None
    for pattern in patterns:
        if isinstance(pattern, RoutePattern):
            if not pattern.regex.match(path):
                continue
            if pattern.methods is None or scope["method"] in pattern.methods:
                return pattern.template
            partial = partial or pattern.template
            continue
        match, _ = pattern.matches(scope)
        template = getattr(pattern, "path_format", None) or UNMATCHED
        if match is Match.FULL:
            return template
        if match is Match.PARTIAL:
            partial = partial or template
    return partial or UNMATCHED


def _route_path(scope: Scope) -> str:
    """The path the routes see: without the `root_path` a proxy serves the app under."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if root_path and path.startswith(root_path) and path[len(root_path):len(root_path) + 1] in ("", "/"):
        return path[len(root_path):]
    return path


class RequestMetricsMiddleware:
    """Counts every HTTP request and times it to the end of its response, labelled with its method, its
    route template (`route_template`) and its status class (`2xx` ... `5xx`)."""

    def __init__(self, app: ASGIApp, *, router: Router) -> None:
        self.app = app
        self.router = router
        self._patterns: list[RoutePattern | BaseRoute] | None = None
        """`route_patterns`, once the app serves: every route is added by then."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # Before the app runs: routing rewrites the scope (a mount's root_path) as it goes.
        if self._patterns is None:
            self._patterns = route_patterns(self.router)
        route = route_template(self._patterns, scope)
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
