"""OPTIONS and 405 answers: `Allow` names every method the path serves, as the OpenAPI contract lists them."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI

pytestmark = pytest.mark.anyio

# Pages of the dashboard are outside the OpenAPI document; what they serve, from the README.
PAGES = {"/": {"GET"}, "/plans/new": {"GET", "POST"}, "/plans/1": {"GET"}, "/calibrations": {"GET"}}
UNDECLARED = ("PUT", "PATCH", "DELETE", "POST", "GET")


def documented(app: FastAPI) -> dict[str, set[str]]:
    """Every API path (parameters filled in) and the methods the OpenAPI document declares for it."""
    return {
        re.sub(r"\{[^}]+\}", "1", path): {method.upper() for method in operations}
        for path, operations in app.openapi()["paths"].items()
    }


def allow(response: httpx.Response) -> set[str]:
    return {method.strip() for method in response.headers["allow"].split(",")}


async def test_options_lists_every_documented_method_of_every_path(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    paths = {**documented(app), **PAGES}
    assert {"/api/v1/calibrations", "/api/v1/calibrations/1", "/api/v1/plans"} <= set(paths)
    for path, methods in paths.items():
        response = await client.options(path)
        assert response.status_code == 204, (path, response.text)
        assert allow(response) - {"HEAD"} == methods | {"OPTIONS"}, path
        assert response.content == b""


async def test_the_calibration_paths_found_in_the_probe(client: httpx.AsyncClient) -> None:
    assert (await client.options("/api/v1/calibrations")).headers["allow"] == "GET, POST, OPTIONS"
    assert (await client.options("/api/v1/calibrations/7")).headers["allow"] == "GET, DELETE, OPTIONS"


async def test_a_405_lists_every_method_the_path_serves(app: FastAPI, client: httpx.AsyncClient) -> None:
    for path, methods in {**documented(app), **PAGES}.items():
        method = next(m for m in UNDECLARED if m not in methods)
        response = await client.request(method, path)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert allow(response) - {"HEAD"} == methods | {"OPTIONS"}, (method, path)


async def test_every_advertised_method_is_served(client: httpx.AsyncClient) -> None:
    """No method in `Allow` is itself refused as not allowed."""
    for path in ("/api/v1/plans", "/api/v1/plans/1", "/api/v1/calibrations", "/api/v1/calibrations/1"):
        for method in allow(await client.options(path)) - {"OPTIONS"}:
            response = await client.request(method, path, json={})
            assert response.status_code != 405, (method, path)


async def test_unknown_paths_are_still_404(client: httpx.AsyncClient) -> None:
    response = await client.options("/api/v1/nothing-here")
    assert response.status_code == 404 and "allow" not in response.headers
