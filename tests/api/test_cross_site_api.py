"""The JSON API refuses state-changing requests that another site's page sent, as the dashboard does
(issue 38, item 8): whatever the body (JSON, text/plain, a form, none), with or without a key, 403
problem+json and nothing done. Same-origin pages and clients that are not browsers still write.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.orm import Session

from api import keys
from tests.api.conftest import CHEAP_PLAN, assert_problem
from tests.api.test_studies import study

PLANS = "/api/v1/plans"
STUDIES = "/api/v1/studies"
# The client's base URL is http://testserver: it sends `Host: testserver`.
OWN_ORIGIN = "http://testserver"
CROSS_SITE: list[dict[str, str]] = [
    {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},  # a current browser
    {"Origin": "https://evil.example"},  # a browser without Fetch metadata
    {"Origin": "null"},  # a sandboxed frame
    {"Sec-Fetch-Site": "same-site", "Origin": "https://other.testserver"},  # a sibling subdomain
    {"Sec-Fetch-Site": "cross-site", "Origin": OWN_ORIGIN},  # Fetch metadata wins over Origin
]
SAME_ORIGIN: list[dict[str, str]] = [
    {"Origin": OWN_ORIGIN, "Sec-Fetch-Site": "same-origin"},
    {"Origin": OWN_ORIGIN},
    {},  # curl and scripts send neither header
]
# What a page on another site can make a browser send without a CORS preflight, and JSON (preflighted,
# but a server must not rely on the browser for that).
BODIES: dict[str, dict[str, Any]] = {
    "none": {},
    "text/plain": {"content": b'{"run_id": null}', "headers": {"Content-Type": "text/plain"}},
    "form": {"data": {"a": "b"}},
    "json": {"json": {}},
}


async def _plan(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await client.post(PLANS, json=CHEAP_PLAN, headers=headers or {})
    assert response.status_code == 201, response.text
    return response.json()


def _refused(response: httpx.Response) -> None:
    problem = assert_problem(response, 403, "cross-site-request")
    assert "another site" in problem["detail"]


@pytest.mark.anyio
@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("sender", range(len(CROSS_SITE)))
async def test_cross_site_bodiless_posts_neither_cancel_nor_replan(
    client: httpx.AsyncClient, body: str, sender: int
) -> None:
    plan = await _plan(client)
    created = await client.post(STUDIES, json=study())
    assert created.status_code == 202, created.text
    study_id = created.json()["id"]
    headers = {**CROSS_SITE[sender], **BODIES[body].get("headers", {})}
    request = {key: value for key, value in BODIES[body].items() if key != "headers"}

    _refused(await client.post(f"{STUDIES}/{study_id}/cancel", headers=headers, **request))
    _refused(await client.post(f"{PLANS}/{plan['id']}/replan", headers=headers, **request))
    _refused(await client.delete(f"{PLANS}/{plan['id']}", headers=CROSS_SITE[sender]))
    _refused(await client.post(PLANS, headers=headers, **request))

    after = (await client.get(f"{STUDIES}/{study_id}")).json()
    assert after["state"] != "cancelled" and after.get("cancel_requested") in (None, False)
    assert (await client.get(f"{PLANS}/{plan['id']}")).status_code == 200
    assert len((await client.get(PLANS)).json()["items"]) == 1  # no re-planned plan, no new plan


@pytest.mark.anyio
async def test_a_cross_site_post_is_refused_before_the_key_is_checked(
    client: httpx.AsyncClient, session: Session
) -> None:
    key = keys.create_key(session, "ci").key
    bearer = {"Authorization": f"Bearer {key}"}
    plan = await _plan(client, bearer)
    for headers in ({**CROSS_SITE[0], **bearer}, CROSS_SITE[0]):  # with a valid key, and without one
        _refused(await client.post(f"{PLANS}/{plan['id']}/replan", headers=headers))
        _refused(await client.post(PLANS, json=CHEAP_PLAN, headers=headers))
    assert len((await client.get(PLANS)).json()["items"]) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("sender", range(len(SAME_ORIGIN)))
async def test_same_origin_pages_and_non_browser_clients_still_write(
    client: httpx.AsyncClient, sender: int
) -> None:
    headers = SAME_ORIGIN[sender]
    plan = await _plan(client, headers)
    created = await client.post(STUDIES, json=study(), headers=headers)
    assert created.status_code == 202, created.text
    cancelled = await client.post(f"{STUDIES}/{created.json()['id']}/cancel", headers=headers)
    assert cancelled.status_code in (200, 409), cancelled.text  # 409: it finished first
    replanned = await client.post(f"{PLANS}/{plan['id']}/replan", headers=headers)
    assert replanned.status_code == 202, replanned.text
    deleted = await client.delete(f"{PLANS}/{plan['id']}", headers=headers)
    assert deleted.status_code == 204, deleted.text


@pytest.mark.anyio
async def test_reads_from_another_site_are_not_refused(client: httpx.AsyncClient) -> None:
    # Reading is not a write: a GET with another site's Origin is answered (CORS keeps the answer from
    # that site's script; the browser, not the server, enforces it).
    response = await client.get(PLANS, headers=CROSS_SITE[0])
    assert response.status_code == 200, response.text


def test_the_openapi_declares_the_refusal_on_every_state_changing_operation(app: FastAPI) -> None:
    paths = app.openapi()["paths"]
    assert "Problem" in app.openapi()["components"]["schemas"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            declared = "403" in operation["responses"]
            assert declared == (method not in ("get", "head", "options")), (method, path)
    cancel = paths["/api/v1/studies/{study_id}/cancel"]["post"]["responses"]["403"]
    assert "application/problem+json" in cancel["content"]
