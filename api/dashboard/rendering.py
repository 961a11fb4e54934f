"""Templates, security headers, content negotiation and error pages of the dashboard.

Pages are server-rendered Jinja2 with autoescaping on everything (plan names are user input), served
with a Content-Security-Policy that allows only this origin's scripts and styles: no inline script or
style can run even if something slipped through escaping.
"""

from __future__ import annotations

from http import HTTPStatus
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.dashboard.formatting import FILTERS
from api.dashboard.vendor import PLOTLY_CSS_URL, PLOTLY_JS_URL, plotly_style_guard_ids
from api.hints import CLI_ACTIVATE, EXECUTOR_EXTRA_INSTALL
from planner import __version__

PACKAGE_DIR = Path(__file__).parent
TEMPLATES_DIR = PACKAGE_DIR / "templates"
STATIC_DIR = PACKAGE_DIR / "static"
STATIC_PREFIX = "/static"

# Charts are drawn by plotly.js from this origin; it styles through the CSSOM (element.style and a
# stylesheet it fills with insertRule), which a strict style-src does not govern.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # Pages show live database contents; a back button must not show a stale plan list from cache.
    "Cache-Control": "no-store",
}

_environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt variable fails tests instead of rendering as nothing
    trim_blocks=True,
    lstrip_blocks=True,
)
_environment.filters.update(FILTERS)
_environment.globals.update(
    version=__version__, static=STATIC_PREFIX, plotly_js=PLOTLY_JS_URL, plotly_css=PLOTLY_CSS_URL,
    plotly_style_guard_ids=plotly_style_guard_ids, cli_activate=CLI_ACTIVATE,
    executor_extra_install=EXECUTOR_EXTRA_INSTALL,
)
templates = Jinja2Templates(env=_environment)


def render(
    request: Request, template: str, context: dict[str, Any], *, status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    response = templates.TemplateResponse(
        request, template, {"active": "", **context}, status_code=status_code,
        headers={**SECURITY_HEADERS, **(headers or {})},
    )
    return response  # type: ignore[return-value]


def _accepted(request: Request) -> dict[str, float]:
    """Media ranges of the Accept header with their q-values."""
    accepted = {}
    for part in request.headers.get("accept", "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        quality = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    quality = float(param[2:])
                except ValueError:
                    quality = 0.0
        if media:
            accepted[media.lower()] = quality
    return accepted


def prefers_json(request: Request) -> bool:
    """True when the client asked for JSON rather than HTML (API clients, `curl -H 'Accept: ...json'`)."""
    accepted = _accepted(request)
    json_quality = max((q for m, q in accepted.items() if m.endswith("json")), default=0.0)
    html_quality = max(accepted.get("text/html", 0.0), accepted.get("application/xhtml+xml", 0.0))
    return json_quality > html_quality


def error_page(
    request: Request, status_code: int, detail: str, *, headers: dict[str, str] | None = None
) -> HTMLResponse:
    return render(
        request, "error.html",
        {"status": status_code, "title": HTTPStatus(status_code).phrase, "detail": detail},
        status_code=status_code, headers=headers,
    )


def mark_dashboard_request(request: Request) -> None:
    """Router dependency: errors on dashboard pages are HTML unless the client asked for JSON."""
    request.state.dashboard_page = True


def wants_dashboard_error_page(request: Request) -> bool:
    """Dashboard pages answer errors in HTML; so does any other non-API path that a browser asked for."""
    if prefers_json(request):
        return False
    if getattr(request.state, "dashboard_page", False):
        return True
    path = request.url.path
    outside_api = not (path.startswith("/api/") or path in ("/healthz", "/readyz", "/docs", "/openapi.json"))
    return outside_api and "text/html" in _accepted(request)


async def handle_http_exception(request: Request, exc: Exception, api_handler: Any) -> Response:
    """HTML error pages for browsers on dashboard paths; the API's problem JSON for everyone else."""
    assert isinstance(exc, StarletteHTTPException)
    if not wants_dashboard_error_page(request):
        return await api_handler(request, exc)
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"There is no page at {request.url.path}."
    return error_page(request, exc.status_code, detail, headers=dict(exc.headers or {}))
