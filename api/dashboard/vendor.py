"""plotly.js, served by this server from the installed `plotly` Python package (never from a CDN).

The file's URL names plotly's version, so browsers may keep it for a year: a new version is a new URL.
It is about 4.8 MB; clients that accept gzip get it compressed once per process (about 1.4 MB). Only
pages with charts load it.

plotly.js injects its stylesheet at run time (a `<style>` element), which the dashboard's
Content-Security-Policy (`style-src 'self'`) refuses. It skips that when the page already has an element
`#plotly.js-style-global.no-inline-styles`: the pages link `PLOTLY_CSS_URL` so, a stylesheet made here
from the very rules the script would inject (read out of the script, so it always matches its version).
Its bundled map library injects its own styles on load unless an element with a known id exists: the
pages carry empty elements with those ids (`plotly_style_guard_ids`), since the dashboard draws no maps.
"""

from __future__ import annotations

import functools
import gzip
import re
from importlib import metadata, resources

from fastapi import FastAPI, Request
from fastapi.responses import Response

PLOTLY_VERSION = metadata.version("plotly")
PLOTLY_JS_URL = f"/static/vendor/plotly-{PLOTLY_VERSION}.min.js"
PLOTLY_CSS_URL = f"/static/vendor/plotly-{PLOTLY_VERSION}.css"
# The rules object in the script: {"X,X div":'direction:ltr;...', ...}, X standing for the plot's root
# and Y for the notifier (what plotly.js's own loop replaces before adding each rule).
_RULES = re.compile(r'\{"X,X div":.*?\}(?=;for\()', re.S)
_STYLE_GUARD = re.compile(
    r'getElementById\("([0-9a-f]{16,128})"\)\)\{var \w+=document\.createElement\("style"\)'
)
_RULE = re.compile(r'"((?:[^"\\]|\\.)*)":(?:\'((?:[^\'\\]|\\.)*)\'|"((?:[^"\\]|\\.)*)")')
HEADERS = {
    "Cache-Control": "public, max-age=31536000, immutable",
    "X-Content-Type-Options": "nosniff",
    "Vary": "Accept-Encoding",
}
JAVASCRIPT = "text/javascript; charset=utf-8"


class PlotlyStylesNotFoundError(RuntimeError):
    """This plotly.js keeps its stylesheet where this module does not look (a newer plotly?)."""


@functools.cache
def plotly_js() -> bytes:
    return (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()


@functools.cache
def plotly_js_gzipped() -> bytes:
    return gzip.compress(plotly_js(), compresslevel=6, mtime=0)


@functools.cache
def plotly_css() -> str:
    """plotly.js's own stylesheet, as the script would inject it."""
    script = plotly_js().decode("utf-8")
    found = _RULES.search(script)
    if found is None:
        raise PlotlyStylesNotFoundError(
            f"plotly {PLOTLY_VERSION}: its stylesheet rules were not found in plotly.min.js; pin plotly to a "
            "version api/dashboard/vendor.py reads (see pyproject.toml)"
        )
    rules = []
    for selector, single, double in _RULE.findall(found.group(0)):
        full = re.sub(r"^,", " ,", selector).replace("X", ".js-plotly-plot .plotly")
        full = full.replace("Y", ".plotly-notifier")
        rules.append(f"{full}{{{single or double}}}")
    header = f"/* plotly {PLOTLY_VERSION}: the rules its plotly.js injects at run time */"
    return "\n".join([header, *rules, ""])


@functools.cache
def plotly_style_guard_ids() -> tuple[str, ...]:
    """Ids of elements whose presence keeps plotly.js's bundled libraries from injecting `<style>`."""
    return tuple(_STYLE_GUARD.findall(plotly_js().decode("utf-8")))


def install(app: FastAPI) -> None:
    """Serve plotly.js at PLOTLY_JS_URL; call before the dashboard mounts /static (first match wins)."""

    @app.get(PLOTLY_JS_URL, include_in_schema=False)
    def plotly_script(request: Request) -> Response:
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            return Response(plotly_js_gzipped(), media_type=JAVASCRIPT,
                            headers={**HEADERS, "Content-Encoding": "gzip"})
        return Response(plotly_js(), media_type=JAVASCRIPT, headers=HEADERS)

    @app.get(PLOTLY_CSS_URL, include_in_schema=False)
    def plotly_stylesheet() -> Response:
        return Response(plotly_css(), media_type="text/css; charset=utf-8", headers=HEADERS)
