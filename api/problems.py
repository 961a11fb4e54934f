"""RFC 9457 problem details: the one shape of every error response, and the handlers that produce it."""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from planner.specs import UNION_TAG_PREFIX

PROBLEM_MEDIA_TYPE = "application/problem+json"

_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")

log = logging.getLogger(__name__)


class FieldError(BaseModel):
    """One invalid input."""

    location: str = Field(examples=["body"])
    """Where the input was: `body`, `query`, `path` or `header`."""
    field: str = Field(examples=["training.seq_len"])
    """Dotted path of the input inside its location (empty for the whole location)."""
    message: str
    type: str
    """Machine-readable error kind, e.g. `missing`, `int_type`, `value_error`."""


class Problem(BaseModel):
    """An error (RFC 9457 problem details); `detail` says what to change."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:fsdp-planner:problem:invalid-request"])
    title: str
    status: int
    detail: str
    instance: str | None = None
    """The request path the problem occurred on."""
    errors: list[FieldError] | None = None
    """For invalid requests: every invalid input."""


class ProblemError(StarletteHTTPException):
    """Raise to answer with a problem; `slug` becomes the problem type, `extensions` extra members.

    An HTTPException, so that FastAPI passes it through untouched even when raised while reading the body.
    """

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        title: str | None = None,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(status, detail, headers)
        self.status = status
        self.slug = slug
        self.title = title or HTTPStatus(status).phrase
        self.errors = errors
        self.extensions = extensions


def problem_response(
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    title: str | None = None,
    instance: str | None = None,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"urn:fsdp-planner:problem:{slug}" if slug else "about:blank",
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = [error.model_dump() for error in errors]
    body.update(extensions)
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def field_errors(errors: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[FieldError]:
    """Pydantic errors as FieldErrors, with the planner's own messages kept word for word."""
    result = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if not str(part).startswith(UNION_TAG_PREFIX)]
        location, path = (loc[0], loc[1:]) if loc else ("body", [])
        message = str(error.get("msg", "invalid value"))
        cause = (error.get("ctx") or {}).get("error")
        if error.get("type") == "value_error" and cause is not None:
            message = str(cause)  # drop pydantic's "Value error, " prefix
        head, sep, _ = message.partition(": ")
        if not path and sep and _FIELD_PATH.fullmatch(head):
            # Whole-model checks have no loc; the planner starts their messages with the field instead.
            path = [head]
        result.append(
            FieldError(location=location, field=".".join(path), message=message, type=error["type"])
        )
    return result


def summarize(errors: list[FieldError]) -> str:
    """One line naming each invalid input, for `detail`."""
    parts = [f"{e.field or e.location}: {_strip_field_prefix(e.message, e.field)}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def _strip_field_prefix(message: str, field: str) -> str:
    # The planner's messages already start with the field name ("global_batch_tokens: ...").
    for prefix in (field, field.rsplit(".", 1)[-1]):
        if prefix and message.startswith(f"{prefix}: "):
            return message[len(prefix) + 2:]
    return message


FASTAPI_BODY_ERROR = "There was an error parsing the body"
"""FastAPI's 400 for a body its JSON reader raised on with anything but a JSONDecodeError (bytes that are
not UTF-8; a body nested past the parser's recursion limit is refused before, by api/text_check.py)."""


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
        cause = exc.__cause__
        reason = (f"byte {cause.start} (0x{cause.object[cause.start]:02x}) is not UTF-8"
                  if isinstance(cause, UnicodeDecodeError) else "it could not be read")
        return problem_response(
            400, f"the request body is not valid JSON: {reason}", slug="malformed-json",
            instance=request.url.path,
        )
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no endpoint at {request.url.path}; the API lives under /api/v1 (see /docs)"
    elif exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    return problem_response(exc.status_code, detail, instance=request.url.path, headers=exc.headers)


async def _validation_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in raw):
        error = raw[0]
        reason = (error.get("ctx") or {}).get("error", "invalid JSON")
        position = error["loc"][-1] if error.get("loc") else "?"
        return problem_response(
            400, f"the request body is not valid JSON: {reason} at character {position}",
            slug="malformed-json", instance=request.url.path,
        )
    content_type = request.headers.get("content-type", "")
    if request.method in ("POST", "PUT", "PATCH") and "json" not in content_type and any(
        tuple(error.get("loc", ())) == ("body",) for error in raw
    ):
        return problem_response(
            415, "send the body as JSON with `Content-Type: application/json` "
            f"(got {content_type or 'none'!r})",
            slug="unsupported-media-type", instance=request.url.path,
        )
    errors = field_errors(raw)
    return problem_response(
        422, summarize(errors), slug="invalid-request", title="Invalid request",
        instance=request.url.path, errors=errors,
    )


async def _problem_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return problem_response(
        exc.status, exc.detail, slug=exc.slug, title=exc.title, instance=request.url.path,
        errors=exc.errors, headers=exc.headers, **exc.extensions,
    )


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_exception)
    app.add_exception_handler(ProblemError, _problem_error)
    app.add_middleware(CatchAllMiddleware)


class CatchAllMiddleware:
    """Turns any unhandled exception into a logged, trace-free 500 problem.

    A pure ASGI middleware rather than an `Exception` handler: Starlette re-raises after running such a
    handler, so the server would log every failure twice.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            response = problem_response(
                500, "the server failed to handle this request; the error was logged",
                slug="internal-error", instance=scope.get("path"),
            )
            await response(scope, receive, send)
