"""OpenAPI declarations of the problem responses an endpoint can give, and the `Location` of what an
endpoint created."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from api.problems import Problem

_DESCRIPTIONS = {
    400: "Malformed request (e.g. the body is not valid JSON)",
    401: "An API key is required, or the one given is unknown or revoked",
    404: "No such resource",
    409: "Conflicts with what is stored (a profile plans use, or a plan deleted while it was being "
    "saved); `detail` says what to do",
    413: "The request body is larger than the configured limit",
    415: "The body is not JSON",
    422: "The request is invalid or cannot be planned; `errors` lists the inputs to fix",
    429: "This client (its API key, or its address when anonymous) already has its share of the search "
    "processes in use; send the request again after `Retry-After` seconds",
    500: "Internal error (logged on the server)",
    503: "The database is unreachable or not migrated, or a search process stopped (send it again)",
}

COMMON = (400, 413, 500)


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for the given error statuses (plus the ones any request can meet)."""
    return {
        status: {"model": Problem, "description": _DESCRIPTIONS[status]}
        for status in sorted({*statuses, *COMMON})
    }


def location(request: Request, name: str, **params: object) -> str:
    """The path of route `name` on this server (under its root path), for `Location` and `Link`: a path,
    not an absolute URL, because an absolute one is built from the client's own `Host` header (any
    client can make the server repeat any host back, e.g. into a cache or a log)."""
    return request.scope.get("root_path", "") + request.app.url_path_for(name, **params)
