"""One refusal for text no database can store: NUL characters and unpaired UTF-16 surrogates, anywhere in
a request (path, query, JSON body, form fields), answered 422 naming the field before any route runs;
and one for JSON bodies nested deeper than MAX_JSON_DEPTH levels, however deep.

PostgreSQL's text and jsonb cannot hold U+0000, and a lone surrogate (`"\\ud800"` in JSON, or its bytes
ED A0 80 that Python's JSON reader lets through) is not a character at all: no UTF-8 encoder writes it,
so a database refuses it and even an error message that quotes it cannot be sent. Checking every field
of every schema (and every free-form JSON value, like a run's `raw`) one by one leaves the next field
open; this middleware reads each request's text once, so every route (the API and the dashboard's
forms) refuses such text the same way, and nothing that reaches a route or the database holds it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import FieldError, ProblemError, problem_response
from api.schemas.plans import MAX_JSON_DEPTH

_SURROGATES = range(0xD800, 0xE000)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Body bytes without which the parsed text cannot hold a NUL or a surrogate: JSON writes them only as
# `\u` escapes (a raw NUL is invalid JSON), raw surrogates are UTF-8 bytes ED A0..BF, and UTF-16/32
# bodies hold zero bytes. Most bodies have none of these and are not parsed twice.
_JSON_MARKERS = (b"\\u", b"\xed", b"\x00")
_SHOWN_SEGMENT = 60


def bad_character(text: str) -> str | None:
    """The first character of `text` that cannot be stored, as a person can read it, or None."""
    found = _UNSTORABLE.search(text)  # in C: a 5 MB string takes milliseconds, not a second
    return None if found is None else f"U+{ord(found.group()):04X}"


def _shown(segment: object) -> str:
    """A path segment as an error may quote it: its bad characters escaped, long names cut."""
    text = str(segment)[:_SHOWN_SEGMENT]
    return "".join(f"\\u{ord(c):04x}" if c == "\x00" or ord(c) in _SURROGATES else c for c in text)


def _strings(document: Any) -> Iterator[tuple[list[object], str]]:
    """(path, text) of every key and string value in a decoded JSON document, without recursion."""
    stack: list[tuple[Any, list[object]]] = [(document, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            yield path, value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield [*path, key], key
                stack.append((item, [*path, key]))
        elif isinstance(value, list):
            stack.extend((item, [*path, index]) for index, item in enumerate(value))


def too_deep_at(document: Any) -> list[object] | None:
    """The path of the first value of a decoded JSON document nested deeper than MAX_JSON_DEPTH levels
    of arrays and objects, or None; measured without recursion."""
    stack: list[tuple[Any, list[object]]] = [(document, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            return path
        if isinstance(value, dict):
            stack.extend((item, [*path, key]) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, [*path, index]) for index, item in enumerate(value))
    return None


def too_deep_refusal(path: list[object] | None) -> ProblemError:
    """The 422 for a JSON body nested deeper than MAX_JSON_DEPTH levels (at `path`, when the parser could
    read that far)."""
    field = "" if path is None else ".".join(_shown(part) for part in path)
    message = (f"nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects; no field of this API "
               "takes more than a few")
    return ProblemError(
        422, f"{field or 'the request body'}: {message}", slug="invalid-request", title="Invalid request",
        errors=[FieldError(location="body", field=field, message=message, type="json_depth")],
    )


class JsonTextError(ValueError):
    """Why a field's JSON text cannot be read; the message says where inside it and what to change."""


def load_json_text(text: str) -> Any:
    """A field's JSON text (a pasted config.json, a list cursor) decoded, nested at most MAX_JSON_DEPTH
    levels and holding only storable text, or JsonTextError saying why not.

    The decoder itself recurses once per level (RecursionError near 1,000), so deeper text is refused
    by that, and text it reads is then measured without recursion; both say the same bound. JSON
    escapes inside the text (`\\u0000`, `\\ud800`) decode to what the request's own check could not
    see, so they are refused here.
    """
    too_deep = f"nested deeper than {MAX_JSON_DEPTH} levels; a config.json nests two or three"
    try:
        document = json.loads(text)
    except RecursionError:
        raise JsonTextError(too_deep) from None
    except json.JSONDecodeError as exc:
        raise JsonTextError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if too_deep_at(document) is not None:
        raise JsonTextError(too_deep)
    for path, string in _strings(document):
        character = bad_character(string)
        if character is not None:
            where = ".".join(_shown(part) for part in path) or "the text"
            raise JsonTextError(f"{where}: {_holds(character)}")
    return document


def _holds(character: str) -> str:
    what = "a NUL character" if character == "U+0000" else "an unpaired UTF-16 surrogate"
    return (
        f"holds {what} ({character}), which no text field can store; remove it"
        + ("" if character == "U+0000" else " (a `\\ud800`-style escape must be half of a pair)")
    )


def refusal(location: str, path: list[object], character: str) -> ProblemError:
    """The 422 for a field at `path` (in `location`) that holds `character`."""
    field = ".".join(_shown(part) for part in path)
    message = _holds(character)
    return ProblemError(
        422, f"{field or location}: {message}", slug="invalid-request", title="Invalid request",
        errors=[FieldError(location=location, field=field, message=message, type="string_character")],
    )


def check_pairs(location: str, pairs: list[tuple[str, str]]) -> None:
    """Raise the refusal for the first name or value of a query string or form that cannot be stored."""
    for name, value in pairs:
        for text in (name, value):
            character = bad_character(text)
            if character is not None:
                raise refusal(location, [name], character)


def check_json_body(body: bytes) -> None:
    """Raise the refusal for a JSON body nested deeper than MAX_JSON_DEPTH levels, or for its first key
    or string that cannot be stored.

    A body nested deeper than the parser goes (near 1,000 levels, a RecursionError that FastAPI answers
    with a bare "error parsing the body") is refused the same way. A body that is not JSON is left for the
    route to refuse with its own message."""
    # Fewer opening brackets than the bound cannot nest past it: most bodies are not parsed twice.
    deep = body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH
    if not deep and not any(marker in body for marker in _JSON_MARKERS):
        return
    try:
        document = json.loads(body)  # as Starlette's Request.json() reads it
    except RecursionError:
        raise too_deep_refusal(None) from None
    except ValueError:
        return
    if deep and (path := too_deep_at(document)) is not None:
        raise too_deep_refusal(path)
    for path, text in _strings(document):
        character = bad_character(text)
        if character is not None:
            raise refusal("body", path, character)


async def check_form(scope: Scope, body: bytes) -> None:
    """Raise the refusal for the first form field (urlencoded or multipart) that cannot be stored."""
    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(scope, replay).form()
    except (StarletteHTTPException, MultiPartException, ValueError):
        return  # not a form the route can read either: it refuses it with its own message
    try:
        check_pairs("body", [(name, value) for name, value in form.multi_items() if isinstance(value, str)])
    finally:
        await form.close()


class TextCheckMiddleware:
    """Refuses a request whose path, query or body text holds NUL or an unpaired surrogate, or whose JSON
    body nests deeper than MAX_JSON_DEPTH levels (422)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._checked(scope, receive)
        except ProblemError as exc:  # ours, or the body size limit's from `receive`
            response = problem_response(
                exc.status, exc.detail, slug=exc.slug, title=exc.title, errors=exc.errors,
                headers=exc.headers, instance=_shown(scope.get("path", "")),
            )
            await response(scope, receive, send)
            return
        if body is None:
            await self.app(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # the disconnect, when the client goes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _checked(self, scope: Scope, receive: Receive) -> bytes | None:
        """Check the path and query; read and check a JSON or form body. The body read, or None if the
        request's body was left unread (nothing in it is text this server parses)."""
        character = bad_character(scope.get("path", ""))
        if character is not None:
            raise refusal("path", [], character)
        query = scope.get("query_string", b"").decode("latin-1")
        check_pairs("query", parse_qsl(query, keep_blank_values=True))
        content_type = Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower()
        is_json = content_type == "" or content_type.endswith("json")
        is_form = content_type in ("application/x-www-form-urlencoded", "multipart/form-data")
        if scope["method"] in ("GET", "HEAD", "OPTIONS") or not (is_json or is_form):
            return None
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if is_form:
            await check_form(scope, body)
        else:
            check_json_body(body)
        return body
