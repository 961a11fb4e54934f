"""Schemathesis' valid requests to the routes that store text and build clusters, each poisoned at one
generated place: the kind of request that found issue 38's items 1 to 3, asked for on purpose.

`test_schemathesis.py` sends what the schema describes. Its valid strings never hold a lone UTF-16
surrogate (schemathesis writes bodies as UTF-8), and a count just past a bound the schema left out only
turns up by chance; the hostile probe of issue 38 found both as 500s among 30,000 requests
(`fingerprint.gpus_per_node` 65 made the fit's ClusterSpec raise; `"\\ud800"` in a model's
`architectures` or a run's `raw` could not be stored or even quoted back). Here each generated body
gets one text leaf or key laced with NUL or half a surrogate pair (sent as JSON escapes): it must come
back 422 naming exactly that field, with nothing stored. And every whole number of a real profile and
run is pushed, one at a time, past each bound some integer field has: no answer may be a 500. On SQLite
and PostgreSQL, like every API test; about ten seconds per database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api import keys
from api.db.models import CalibrationProfileRow, PlanRow, StudyRow, ValidationRunRow
from tests.api.conftest import CHEAP_PLAN, cpu_profile

POSITIVE = schemathesis.GenerationMode.POSITIVE
POISONS = ("\x00", "\ud800", "\udfff")
TABLES = (CalibrationProfileRow, PlanRow, StudyRow, ValidationRunRow)
# Routes whose bodies carry text to store, with how many poisoned examples each (more where free-form
# JSON is stored: calibrations and runs).
ROUTES = {
    "/api/v1/calibrations": 40,
    "/api/v1/plans/{plan_id}/runs": 40,
    "/api/v1/plans": 15,
    "/api/v1/studies": 15,
}
# Generated text holds no NUL of its own, so that the one poison is the only text refused.
CONFIG = schemathesis.Config.from_dict({"generation": {"allow-x00": False}})
HUGE = (0, 65, 4097, 2**31, 2**53, 10**30)
"""Zero, and past the GPUs per node, nodes, int32, exact doubles, int64: each bound some integer field has."""
WHOLE_NUMBERS = {
    # A real profile with every fingerprint count spelled out, and a completed and an OOM run.
    "/api/v1/calibrations": [cpu_profile(fingerprint={**cpu_profile()["fingerprint"], "num_nodes": 1})],
    "/api/v1/plans/{plan_id}/runs": [
        {"measured_step_time_s": 1.0, "measured_tokens_per_s_per_gpu": 1000.0, "steps": 10, "raw": {"n": 3}},
        {"outcome": "oom", "steps": 0, "oom": {"step": 2, "phase": "backward", "requested_bytes": 1 << 30}},
    ],
}


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """(path, kind, value) of every string value, dict key and whole number of a JSON body."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key), "key", key
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    elif isinstance(value, str):
        yield path, "text", value
    elif isinstance(value, int) and not isinstance(value, bool):
        yield path, "count", value


def replaced(document: Any, path: tuple[Any, ...], kind: str, new: Any) -> Any:
    """`document` with the leaf (or, for `key`, the key) at `path` replaced by `new`."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(document, list):
        return [replaced(item, rest, kind, new) if i == head else item for i, item in enumerate(document)]
    if kind == "key" and not rest:
        return {(new if key == head else key): item for key, item in document.items()}
    return {key: replaced(item, rest, kind, new) if key == head else item for key, item in document.items()}


def shown(part: Any) -> str:
    """A field path segment as the refusal names it (api/text_check.py: bad characters escaped)."""
    return "".join(f"\\u{ord(c):04x}" if c in POISONS else c for c in str(part)[:60])


def stored(session: Session) -> dict[str, int]:
    session.expire_all()
    return {row.__tablename__: session.scalar(select(func.count()).select_from(row)) or 0 for row in TABLES}


@pytest.mark.parametrize("path", list(ROUTES))
def test_poisoned_valid_bodies_are_refused_naming_the_field_never_a_500(
    app: FastAPI, session: Session, path: str
) -> None:
    key = keys.create_key(session, "fuzz").key
    client = TestClient(app)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    plan = client.post("/api/v1/plans", json=CHEAP_PLAN, headers=headers)
    assert plan.status_code == 201, plan.text
    url = path.replace("{plan_id}", str(plan.json()["id"]))
    operation = schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)[path]["POST"]
    served: list[int] = []

    cases = operation.as_strategy(generation_mode=POSITIVE)

    @given(case=cases, data=st.data(), poison=st.sampled_from(POISONS))
    @settings(max_examples=ROUTES[path], deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def check(case: schemathesis.Case, data: st.DataObject, poison: str) -> None:
        body = case.body
        targets = [leaf for leaf in leaves(body) if leaf[1] != "count"]
        if not isinstance(body, dict) or not targets:
            return
        where, kind, old = data.draw(st.sampled_from(targets), label="leaf")
        at = data.draw(st.integers(0, len(old)), label="at")
        laced = old[:at] + poison + old[at:]
        sent = replaced(body, where, kind, laced)
        if kind == "key":  # the refusal names the key as sent
            where = (*where[:-1], laced)
        before = stored(session)
        # json.dumps writes the poison as an escape (`\u0000`, `\ud800`): the text any client can send.
        response = client.post(url, content=json.dumps(sent).encode(), headers=headers)
        served.append(response.status_code)
        assert response.status_code == 422, f"{response.status_code} for {json.dumps(sent)[:2000]}"
        problem = response.json()
        assert [(e["location"], e["field"]) for e in problem["errors"]] == [
            ("body", ".".join(shown(part) for part in where))], problem
        assert stored(session) == before

    check()
    assert len(served) >= ROUTES[path] // 2, f"only {len(served)} bodies had a leaf to poison"


@pytest.mark.parametrize("path", list(WHOLE_NUMBERS))
def test_every_whole_number_past_each_bound_is_never_a_500(app: FastAPI, session: Session, path: str) -> None:
    """Item 1's class: a count the schema allowed but a later step (the fit's ClusterSpec) did not."""
    client = TestClient(app)
    plan = client.post("/api/v1/plans", json=CHEAP_PLAN)
    url = path.replace("{plan_id}", str(plan.json()["id"]))
    sent = 0
    for body in WHOLE_NUMBERS[path]:
        assert client.post(url, json=body).status_code == 201  # the body itself is valid
        firsts: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for where, kind, _ in leaves(body):  # each field once (a list's first entry stands for the rest)
            if kind == "count":
                firsts.setdefault(tuple(part for part in where if not isinstance(part, int)), where)
        for where in firsts.values():
            for value in HUGE:
                response = client.post(url, json=replaced(body, where, "count", value))
                sent += 1
                assert response.status_code < 500, f"{where} = {value}: {response.status_code}"
                if response.status_code != 201:
                    assert response.status_code == 422, response.text
    assert sent >= 2 * len(HUGE), sent
