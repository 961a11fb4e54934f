"""ASGI middleware: a request body size limit that answers with a problem whether or not the endpoint
reads the body, and OPTIONS / 405 answers whose `Allow` names every method a path supports."""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import ProblemError, problem_response
from api.typed_numbers import parse_whole


class BodySizeLimitMiddleware:
    """Refuses bodies over `max_bytes` with 413.

    A declared Content-Length over the limit is refused before anything is read. A chunked body is
    counted as it streams; crossing the limit raises a 413 ProblemError (an HTTPException) from `receive`,
    which FastAPI re-raises and the problem handlers render. (Starlette's own limiter answers in plain
    text when the endpoint never reads the body, and every error here is problem+json.)
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        size = None if declared is None else parse_whole(declared, low=0, high=10**18)
        if declared is not None and (size is None or size > self.max_bytes):
            status, detail = (
                (413, f"request body of {declared} bytes is larger than the {self.max_bytes}-byte limit")
                if size is not None
                else (400, f"Content-Length {declared!r} is not a byte count")
            )
            await problem_response(status, detail, slug="body-too-large" if status == 413 else None,
                                   instance=scope.get("path"))(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ProblemError(
                        413, f"request body is larger than the {self.max_bytes}-byte limit",
                        slug="body-too-large",
                    )
            return message

        await self.app(scope, limited_receive, send)


# The methods a route can declare; OPTIONS is answered here for every path.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
# Not a method anything declares: a route that accepts it (a Mount) leaves methods to the app inside.
_PROBE = "FSDP-PLANNER-PROBE"


class AllowedMethodsMiddleware:
    """Answers OPTIONS with 204 and `Allow`, and makes every 405's `Allow` complete.

    The router stops at the first route whose path matches, so its 405 (and, with no OPTIONS routes,
    every OPTIONS is a 405) named only that route's methods: `Allow: POST` on a path that also serves
    GET. The router itself is asked instead, once per method, which routes accept the path.
    """

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and not self._accepts(scope, "OPTIONS"):
            allowed = self.allowed_methods(scope)
            if allowed:
                await Response(status_code=204, headers={"Allow": _allow(allowed)})(scope, receive, send)
                return

        async def complete_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                allowed = self.allowed_methods(scope)
                if allowed:
                    MutableHeaders(scope=message)["Allow"] = _allow(allowed)
            await send(message)

        await self.app(scope, receive, complete_allow)

    def allowed_methods(self, scope: Scope) -> list[str]:
        """The methods some route serves at this path; empty for none, or for a mounted app's path."""
        if self._accepts(scope, _PROBE):
            return []
        return [method for method in METHODS if self._accepts(scope, method)]

    def _accepts(self, scope: Scope, method: str) -> bool:
        probe = {**scope, "method": method}
        return any(route.matches(probe)[0] is Match.FULL for route in self.router.routes)


def _allow(methods: list[str]) -> str:
    return ", ".join([*methods, "OPTIONS"])
