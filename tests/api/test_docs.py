"""/docs is served from this server's own assets: it works on a machine without internet."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.api.conftest import assert_problem

pytestmark = pytest.mark.anyio


async def test_docs_reference_only_local_assets_and_they_are_served(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert {"/static/swagger-ui/swagger-ui-bundle.js", "/static/swagger-ui/swagger-ui.css"} <= set(urls)
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"{url} is not served by this server"
        asset = await client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url
    assert re.search(r"""url: ['"]/openapi\.json['"]""", page.text)
    assert "cdn" not in page.text.lower() and "https://" not in page.text


async def test_the_schema_the_docs_load_is_served(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    assert schema["openapi"].startswith("3.1") and "/api/v1/plans" in schema["paths"]


async def test_redoc_is_not_offered(client: httpx.AsyncClient) -> None:
    # It would load from a CDN; /docs is the one API reference, and the 404 says where it is.
    body = assert_problem(await client.get("/redoc"), 404)
    assert "/docs" in body["detail"]
