"""API keys: writes need one once any exists, reads stay open unless configured, revoked keys fail."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api import keys
from api.app import create_app
from api.db.models import ApiKeyRow
from api.settings import Settings
from tests.api.conftest import assert_problem, cheap_plan

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_writes_are_open_while_no_key_exists(client: httpx.AsyncClient) -> None:
    created = await client.post(PLANS, json=cheap_plan())
    assert created.status_code == 201
    assert (await client.delete(f"{PLANS}/{created.json()['id']}")).status_code == 204


async def test_writes_need_a_valid_key_once_one_exists(client: httpx.AsyncClient, session: Session) -> None:
    issued = keys.create_key(session, "ci")
    keys.create_key(session, "alice")

    problem = assert_problem(await client.post(PLANS, json=cheap_plan()), 401, "unauthorized")
    assert "Authorization: Bearer" in problem["detail"] and "keys create" in problem["detail"]
    for wrong in (
        "nonsense",
        issued.key[:-1] + ("A" if issued.key[-1] != "A" else "B"),
        "fsdpk_" + issued.row.prefix + "_x",
        "",
    ):
        response = await client.post(PLANS, json=cheap_plan(), headers=bearer(wrong))
        assert_problem(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    # Basic auth is not a bearer key either.
    assert_problem(await client.post(PLANS, json=cheap_plan(), headers={"Authorization": "Basic eDp5"}), 401)

    created = await client.post(PLANS, json=cheap_plan(), headers=bearer(issued.key))
    assert created.status_code == 201
    plan_url = f"{PLANS}/{created.json()['id']}"
    # Reads stay open.
    assert (await client.get(plan_url)).status_code == 200
    assert (await client.get(PLANS)).status_code == 200
    assert (await client.get("/api/v1/models")).status_code == 200
    # Deleting is a write.
    assert_problem(await client.delete(plan_url), 401)
    assert (await client.delete(plan_url, headers=bearer(issued.key))).status_code == 204


async def test_authentication_comes_before_body_validation(
    client: httpx.AsyncClient, session: Session
) -> None:
    keys.create_key(session, "ci")
    # An anonymous caller learns nothing about what the body should look like.
    assert_problem(await client.post(PLANS, json={"bogus": 1}), 401)


async def test_revoked_keys_stop_working(client: httpx.AsyncClient, session: Session) -> None:
    first = keys.create_key(session, "ci")
    second = keys.create_key(session, "backup")
    assert (await client.post(PLANS, json=cheap_plan(), headers=bearer(first.key))).status_code == 201
    keys.revoke_key(session, "ci")
    assert_problem(await client.post(PLANS, json=cheap_plan(top_k=1), headers=bearer(first.key)), 401)
    assert (await client.post(PLANS, json=cheap_plan(top_k=1), headers=bearer(second.key))).status_code == 201
    # With every key revoked, the server is open again (as `keys revoke` warns).
    keys.revoke_key(session, str(second.row.id))
    assert (await client.post(PLANS, json=cheap_plan(top_k=2))).status_code == 201


@pytest.fixture
async def locked_reads_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"require_key_for_reads": True}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        yield client
    app.state.engine.dispose()


async def test_reads_can_require_a_key(locked_reads_client: httpx.AsyncClient, session: Session) -> None:
    assert (await locked_reads_client.get(PLANS)).status_code == 200  # no keys yet: open
    issued = keys.create_key(session, "reader")
    for path in (PLANS, f"{PLANS}/1", "/api/v1/models", "/api/v1/gpus"):
        assert_problem(await locked_reads_client.get(path), 401)
    assert (await locked_reads_client.get(PLANS, headers=bearer(issued.key))).status_code == 200
    assert (await locked_reads_client.get("/healthz")).status_code == 200  # probes never need a key
    assert (await locked_reads_client.get("/readyz")).status_code == 200


def test_keys_are_stored_hashed_and_names_unique_among_active(session: Session) -> None:
    issued = keys.create_key(session, "ci")
    row = session.scalar(select(ApiKeyRow))
    assert row is not None
    assert issued.key not in (row.hashed_key, row.prefix) and row.hashed_key == keys.hash_key(issued.key)
    assert issued.key.startswith(f"fsdpk_{row.prefix}_") and len(issued.key) > 40
    assert keys.verify_key(session, issued.key) == row
    with pytest.raises(keys.ApiKeyError, match="active key named 'ci' exists"):
        keys.create_key(session, "ci")
    keys.revoke_key(session, "ci")
    with pytest.raises(keys.ApiKeyError, match="already revoked"):
        keys.revoke_key(session, str(row.id))
    with pytest.raises(keys.ApiKeyError, match="no key"):
        keys.revoke_key(session, "ci")
    assert keys.verify_key(session, issued.key) is None
    # The name is free again once its key is revoked.
    assert keys.create_key(session, "ci").row.id != row.id
    with pytest.raises(keys.ApiKeyError, match="printable"):
        keys.create_key(session, "  ")
