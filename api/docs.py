"""The interactive API reference at /docs, served entirely by this server.

FastAPI's default page loads Swagger UI from a CDN, which leaves /docs blank on a cluster without
internet. The Swagger UI files come from the `swagger-ui-bundle-v2` package (Swagger UI 5, Apache-2.0;
5.x renders the OpenAPI 3.1 schema FastAPI writes) and are served under /static/swagger-ui like the
dashboard's own assets. ReDoc has no such package, so it is not offered: /docs is the one reference.
The page carries the dashboard's security headers (CSP, nosniff, no framing).
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from api.dashboard.rendering import CONTENT_SECURITY_POLICY, SECURITY_HEADERS

DOCS_PATH = "/docs"
SWAGGER_UI_PREFIX = "/static/swagger-ui"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def install(app: FastAPI) -> None:
    """Serve /docs and its assets; call before the dashboard mounts /static (first mount wins)."""
    app.mount(SWAGGER_UI_PREFIX, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    page = get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json",
        title=f"{app.title} {app.version}: API reference",
        swagger_js_url=f"{SWAGGER_UI_PREFIX}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER_UI_PREFIX}/swagger-ui.css",
        swagger_favicon_url=f"{SWAGGER_UI_PREFIX}/favicon-32x32.png",
    )
    headers = {**SECURITY_HEADERS, "Content-Security-Policy": docs_policy(page.body.decode())}

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return HTMLResponse(page.body, headers=headers)


def docs_policy(html: str) -> str:
    """The dashboard's policy, with the page's own inline start-up script allowed by its hash (the page
    is the same on every request) and inline styles, which Swagger UI sets on its elements."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
        for script in _INLINE_SCRIPT.findall(html)
    )
    return (
        CONTENT_SECURITY_POLICY.replace("script-src 'self'", f"script-src 'self' {hashes}")
        .replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
    )
