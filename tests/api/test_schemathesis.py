"""Property-based contract tests from the app's own OpenAPI schema, with every schemathesis check on.

Schemathesis generates valid (positive) and invalid (negative) requests for every operation and runs
all its checks on each response: no server errors, responses (status code, content type, headers,
body) as the schema declares them, invalid data rejected, valid data accepted, auth enforced, the
Allow header of 405s. A plan and a calibration profile are stored first, and positive requests aim at
them half of the time, so the paths that read and compute from stored rows run too. After every write
that stores a measurement, the dashboard pages drawing it must still render (issue 12: one stored
run made /accuracy a 500 for everyone).

Examples are bounded and derandomized (a fixed seed per operation), so a CI run is repeatable and
takes well under a minute per backend on a 2-core machine. (Schemathesis' pytest loader does not
work with pytest 9, so operations are driven through `as_strategy`: the same generation and checks.)
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from sqlalchemy.orm import Session

from api import keys
from api.app import create_app
from api.settings import Settings
from planner.bounds import StepSeconds
from tests.api.conftest import CHEAP_PLAN, cpu_profile

# The schema does not depend on the database; an unconnected in-memory engine is enough to read it.
_PATHS = create_app(Settings(database_url="sqlite://", migrate_on_startup=False)).openapi()["paths"]
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
# CI's run; bench/schemathesis_long.py sets FSDP_PLANNER_SCHEMATHESIS_EXAMPLES for the long hostile run
# (tens of thousands of requests per database) with the same generation and checks.
_PER_MODE = int(os.environ.get("FSDP_PLANNER_SCHEMATHESIS_EXAMPLES", "30"))
EXAMPLES = {POSITIVE: _PER_MODE, NEGATIVE: _PER_MODE}
STATUSES: Counter[int] = Counter()
"""Every response's status code in this process, for the long run's tally."""
CASES = [
    (mode, method.upper(), path)
    for path, item in _PATHS.items()
    for method, operation in item.items()
    for mode in EXAMPLES
    # An operation without inputs has no invalid request to generate.
    if mode is POSITIVE or operation.get("parameters") or operation.get("requestBody")
]
ALL_CHECKS = [
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_schema_conformance", "response_headers_conformance", "positive_data_acceptance",
    "negative_data_rejection", "use_after_free", "ensure_resource_availability", "missing_required_header",
    "ignored_auth", "object_level_authorization", "unsupported_method", "allow_header_conformance",
]
# Valid data must be accepted: 2xx, or 401 / 404 for a missing key or row. Only planning, profile
# uploads, list cursors and comparisons may answer schema-valid input with 422, for rules no JSON schema
# can state: which model fits on which cluster, which names the catalogs know, that a timing and a size
# together imply a physical rate, that heads divide the hidden size, which opaque cursors this server
# issued, that 2 to 8 distinct ids are named across repeated `ids=` values, that a study's batch is whole
# sequences and its GPU types distinct, that a launcher's node selector names each key once and that AMD
# GPUs come with an image (the official one is a CUDA build).
# `refused_only_for_unstatable_rules` below holds them to it.
MAY_REFUSE_VALID_DATA = (
    "POST /api/v1/plans", "POST /api/v1/plans/{plan_id}/replan", "POST /api/v1/calibrations",
    "GET /api/v1/plans", "GET /api/v1/plans/compare", "POST /api/v1/studies",
    "GET /api/v1/plans/{plan_id}/launcher",
)
CONDITIONALLY_REQUIRED = {"/api/v1/calibrations": {"gpu"}}
"""Fields the schema marks optional that a rule across fields requires: a profile may leave out `gpu`
only when `fingerprint.device_name` names a catalog GPU."""
CONFIG: dict[str, Any] = {
    # NUL is text no database stores, refused in every field by one rule (api/text_check.py) that no
    # JSON schema of a free-form value (a run's `raw`) can state: valid data holds none, and
    # test_schemathesis_poisoned.py sends it, and lone surrogates, on purpose.
    "generation": {"allow-x00": False},
    "checks": {
        **{name: {"enabled": True} for name in ALL_CHECKS},
        "positive_data_acceptance": {"enabled": True, "expected-statuses": ["2xx", "401", "404"]},
    },
    "operations": [
        # One `include-name` each: separate method and path filters would match either.
        {"include-name": name,
         "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "422"]}}}
        for name in MAY_REFUSE_VALID_DATA
    ],
}
# Error types of rules a schema does state: a schema-valid request refused with one of these means the
# schema and the server disagree.
STATABLE = frozenset({
    "missing", "extra_forbidden", "int_type", "int_parsing", "float_type", "float_parsing", "string_type",
    "bool_type", "dict_type", "list_type", "model_type", "greater_than", "greater_than_equal", "less_than",
    "less_than_equal", "finite_number", "string_too_short", "string_too_long", "too_short", "too_long",
    "string_pattern_mismatch", "literal_error", "enum", "union_tag_invalid", "physical_bound",
})
# What the dashboard draws from stored rows, per write that stores them.
PAGES_AFTER_WRITE = {
    "/api/v1/plans/{plan_id}/runs": lambda case, body: ["/accuracy", f"/plans/{body['plan_id']}"],
    "/api/v1/calibrations": lambda case, body: ["/calibrations", f"/calibrations/{body['id']}"],
    "/api/v1/studies": lambda case, body: ["/studies", f"/studies/{body['id']}"],
}


@pytest.fixture
def api_key(session: Session) -> str:
    # With a key stored, the schema's security is real: checks also try requests without it.
    return keys.create_key(session, "schemathesis").key


@pytest.fixture
def stored(app: FastAPI, api_key: str) -> dict[str, int]:
    """A plan and a calibration profile in the database: the rows positive requests aim at."""
    client = TestClient(app)
    auth = {"Authorization": f"Bearer {api_key}"}
    plan = client.post("/api/v1/plans", json=CHEAP_PLAN, headers=auth)
    calibration = client.post("/api/v1/calibrations", json=cpu_profile(), headers=auth)
    assert plan.status_code == 201 and calibration.status_code == 201, (plan.text, calibration.text)
    return {"plan_id": plan.json()["id"], "calibration_id": calibration.json()["id"]}


def pages_still_render(app: FastAPI) -> Any:
    """A check: after a write that stored a measurement, the pages that draw it answer 200."""
    client = TestClient(app)

    def stored_values_render(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
        pages = PAGES_AFTER_WRITE.get(case.operation.path)
        if case.method != "POST" or pages is None or not 200 <= response.status_code < 300:
            return None
        for page in pages(case, response.json()):
            shown = client.get(page)
            assert shown.status_code == 200, f"{page}: {shown.status_code} after {case.as_curl_command()}"
        return True

    return stored_values_render


def tally(ctx: Any, response: Any, case: schemathesis.Case) -> None:
    """Not a check: counts every response's status code (a failing one's too) in STATUSES."""
    STATUSES[response.status_code] += 1


def refused_only_for_unstatable_rules(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """A check: where valid data may get a 422, the refusal names no rule the schema could have stated."""
    if case.meta is None or not case.meta.generation.mode.is_positive or response.status_code != 422:
        return None
    conditional = CONDITIONALLY_REQUIRED.get(case.operation.path, set())
    statable = [
        e for e in response.json().get("errors") or []
        if e["type"] in STATABLE and not (e["type"] == "missing" and e["field"] in conditional)
    ]
    assert not statable, f"schema-valid request refused for a rule the schema does not state: {statable}"
    return True


@pytest.mark.parametrize(("mode", "method", "path"), CASES, ids=[f"{m.value} {v} {p}" for m, v, p in CASES])
def test_operation_conforms(
    app: FastAPI, api_key: str, stored: dict[str, int], method: str, path: str,
    mode: schemathesis.GenerationMode,
) -> None:
    exercise(app, api_key=api_key, stored=stored, method=method, path=path, mode=mode)


def exercise(
    app: FastAPI, *, api_key: str, stored: dict[str, int], method: str, path: str,
    mode: schemathesis.GenerationMode,
) -> None:
    """Generate `mode` requests for one operation and run every check on each response."""
    config = schemathesis.Config.from_dict(CONFIG)
    operation = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)[path][method]
    aimed = [name for name in stored if f"{{{name}}}" in path] if mode is POSITIVE else []
    check_pages = pages_still_render(app)

    @given(case=operation.as_strategy(generation_mode=mode), at_stored=st.booleans())
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: schemathesis.Case, at_stored: bool) -> None:
        if at_stored:
            for name in aimed:
                case.path_parameters[name] = stored[name]
        case.call_and_validate(
            headers={"Authorization": f"Bearer {api_key}"},
            additional_checks=[tally, check_pages, refused_only_for_unstatable_rules],
        )

    check()


class Measured(BaseModel):
    seconds: StepSeconds


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("broken", "mode", "caught"),
    [
        # A 422 for a schema-valid body, naming a bound the schema states.
        ("refuses_valid", POSITIVE, "refused for a rule the schema does not state"),
        # A 200 for a body the schema says is invalid.
        ("accepts_invalid", NEGATIVE, "Schema-violating request accepted"),
        # A response body that does not match the declared response.
        ("wrong_response", POSITIVE, "Response violates schema"),
    ],
)
def test_the_harness_catches_a_broken_contract(
    app: FastAPI, api_key: str, broken: str, mode: schemathesis.GenerationMode, caught: str
) -> None:
    """The checks can fail: an operation that breaks its own schema in each way is caught."""

    async def endpoint(request: Request) -> JSONResponse:
        try:
            seconds = (await request.json())["seconds"]
        except Exception:
            seconds = None
        if broken == "refuses_valid" and isinstance(seconds, float | int) and seconds > 10:
            return JSONResponse({"errors": [{"type": "less_than_equal"}]}, status_code=422)
        if broken == "wrong_response":
            return JSONResponse({"seconds": "soon"})
        if broken == "accepts_invalid" or isinstance(seconds, float | int):
            return JSONResponse({"seconds": 1.0})
        return JSONResponse({"errors": []}, status_code=422)

    app.add_api_route(
        "/api/v1/broken", endpoint, methods=["POST"], response_model=Measured,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": Measured.model_json_schema()}}}},
    )
    with pytest.raises(BaseException) as failure:  # schemathesis raises a group of its failures
        exercise(app, api_key=api_key, stored={}, method="POST", path="/api/v1/broken", mode=mode)
    assert caught in "".join(traceback.format_exception(failure.value))
