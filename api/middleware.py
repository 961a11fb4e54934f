"""Request body size limit that answers with a problem, whether or not the endpoint reads the body."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import ProblemError, problem_response


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
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            status, detail = (
                (413, f"request body of {declared} bytes is larger than the {self.max_bytes}-byte limit")
                if declared.isdigit()
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
