"""The interactive API reference at /docs and the documentation site at /docs/guide, served entirely
by this server.

FastAPI's default page loads Swagger UI from a CDN, which leaves /docs blank on a cluster without
internet. The Swagger UI files come from the `swagger-ui-bundle-v2` package (Swagger UI 5, Apache-2.0;
5.x renders the OpenAPI 3.1 schema FastAPI writes) and are served under /static/swagger-ui like the
dashboard's own assets. ReDoc has no such package, so it is not offered: /docs is the one reference.
The page carries the dashboard's security headers (CSP, nosniff, no framing).

The guide is the site `mkdocs build` writes from docs/ (`Settings.docs_site_dir`, `site/` in the
checkout): its pages are served as built, each with the same policy as /docs (their inline start-up
scripts allowed by hash), so it reads offline too. Until it is built, /docs/guide is a 404 page that
says how to build it.
"""

from __future__ import annotations

import base64
import hashlib
import re
import stat
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from api.dashboard.rendering import CONTENT_SECURITY_POLICY, SECURITY_HEADERS, error_page

DOCS_PATH = "/docs"
GUIDE_PATH = "/docs/guide"
SWAGGER_UI_PREFIX = "/static/swagger-ui"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def install(app: FastAPI, *, guide_dir: Path) -> None:
    """Serve /docs and its assets, and the guide built into `guide_dir` at /docs/guide; call before the
    dashboard mounts /static (first mount wins)."""
    install_guide(app, site_dir=guide_dir)
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


def install_guide(app: FastAPI, *, site_dir: Path) -> None:
    """GET /docs/guide/{path}: the built site's files (a folder answers its index.html), or a 404 page."""
    files = StaticFiles(directory=site_dir, check_dir=False)  # its lookup keeps every path inside site_dir

    @app.get(GUIDE_PATH, include_in_schema=False)
    def guide_root() -> RedirectResponse:
        # The pages link relative to their own folder, so the site's root needs its trailing slash.
        return RedirectResponse(f"{GUIDE_PATH}/", status_code=308)

    @app.get(GUIDE_PATH + "/{path:path}", include_in_schema=False)
    async def guide(request: Request, path: str) -> Response:
        if not (site_dir / "index.html").is_file():
            return error_page(request, 404, (
                f"The documentation site is not built in {site_dir.resolve()}. Build it in the checkout with "
                "`mkdocs build` (mkdocs comes with the dev extra: `pip install '.[dev]'`, or run "
                "./scripts/test.sh once), or point FSDP_PLANNER_DOCS_SITE_DIR at a built site, then reload "
                "this page. The same pages are the docs/ folder of the repository."
            ))
        full_path, found = await anyio.to_thread.run_sync(files.lookup_path, path)
        if found is not None and stat.S_ISDIR(found.st_mode):
            if path and not path.endswith("/"):
                return RedirectResponse(f"{GUIDE_PATH}/{path}/", status_code=308)
            full_path, found = await anyio.to_thread.run_sync(files.lookup_path, f"{path}index.html")
        if found is None or not stat.S_ISREG(found.st_mode):
            return error_page(request, 404, f"The documentation site has no page at {request.url.path}.")
        if full_path.endswith(".html"):
            html = await anyio.to_thread.run_sync(Path(full_path).read_text, "utf-8")
            policy = docs_policy(html)  # each page's own inline scripts, by hash
            return HTMLResponse(html, headers={**SECURITY_HEADERS, "Content-Security-Policy": policy})
        return FileResponse(full_path, stat_result=found, headers={"X-Content-Type-Options": "nosniff"})
