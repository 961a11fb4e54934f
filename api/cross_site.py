"""Cross-site writes: the one check of whether another site's page made a browser send a request.

Browsers say where a request comes from: `Sec-Fetch-Site` (every current browser), else `Origin`,
compared with the Host the request was sent to. A request with neither is not a browser's cross-site
request (curl, scripts, very old browsers) and is let through; so is one from the service's own pages.
Whatever the body (JSON, `text/plain`, a form, none at all), a state-changing request another site sent
is refused before anything reads it: a browser sends such requests without a CORS preflight, re-sends
Basic credentials with them, and a server with no key may sit on a network that only the victim's
browser can reach.

The dashboard's form posts answer with its 403 page (api/dashboard/access.py); every other path under
`prefix` (the JSON API) with a 403 problem, from `CrossSiteMiddleware`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from api.problems import problem_response

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values of a request the user made on this origin (`none`: typed, bookmarked, reloaded).
# `same-site` is refused too: a sibling subdomain may be someone else's.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})


def cross_site_sender(method: str, headers: Headers) -> str | None:
    """The header that names another site as the sender of this state-changing request (for the
    refusal's message), or None when the request may proceed (a safe method, the service's own page,
    or no browser's metadata at all)."""
    if method.upper() in SAFE_METHODS:
        return None
    site = headers.get("sec-fetch-site")
    origin = headers.get("origin")
    if site is not None:
        if site.strip().lower() in OWN_FETCH_SITES:
            return None
        return f"Sec-Fetch-Site: {site[:40]}"
    if origin is not None:
        if _origin_host(origin) == headers.get("host", "").strip().lower():
            return None
        return f"Origin: {origin[:100]}"
    return None


def _origin_host(origin: str) -> str:
    """`host[:port]` of an Origin header as a Host header spells it (browsers leave default ports out)."""
    try:
        parts = urlsplit(origin.strip().lower())
        return parts.netloc if parts.scheme in ("http", "https") and parts.hostname else ""
    except ValueError:  # a malformed origin (e.g. a bad IPv6 literal) is nobody's own
        return ""


class CrossSiteMiddleware:
    """Answers 403 (problem+json) to a state-changing request under `prefix` that another site sent,
    before routing, authentication or the body are looked at (so the status is the same whatever the
    body or the key: even a 401 or a 422 tells another site more than it should learn)."""

    def __init__(self, app: ASGIApp, *, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.prefix):
            sender = cross_site_sender(scope["method"], Headers(scope=scope))
            if sender is not None:
                await problem_response(
                    403, f"this request was sent by another site's page ({sender}), so nothing was done: "
                    "the API accepts state-changing requests from its own pages and from clients that are "
                    "not browsers (which send neither Origin nor Sec-Fetch-Site)",
                    slug="cross-site-request", title="Cross-site request refused", instance=scope["path"],
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)
