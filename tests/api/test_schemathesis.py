"""Property-based API tests from the app's own OpenAPI schema: no 5xx, and responses match the schema.

Schemathesis generates valid (positive) and invalid (negative) requests for every operation and runs
its checks on each response. (Its pytest fixture loader does not work with pytest 9, so the
operations are driven through `as_strategy` here, which is the same generation and the same checks.)
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from sqlalchemy.orm import Session

from api import keys
from api.app import create_app
from api.settings import Settings

# The schema does not depend on the database; an unconnected in-memory engine is enough to read it.
_PATHS = create_app(Settings(database_url="sqlite://", migrate_on_startup=False)).openapi()["paths"]
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
EXAMPLES = {POSITIVE: 40, NEGATIVE: 40}
CASES = [
    (mode, method.upper(), path)
    for path, item in _PATHS.items()
    for method, operation in item.items()
    for mode in EXAMPLES
    # An operation without inputs has no invalid request to generate.
    if mode is POSITIVE or operation.get("parameters") or operation.get("requestBody")
]
# A schema-valid body can still name an unknown model or a batch that does not divide over the GPUs:
# the API answers those with 422 and the field to fix, so 422 counts as a legitimate answer to valid data.
CONFIG = {"checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "422"]}}}


@pytest.fixture
def api_key(session: Session) -> str:
    # With a key stored, the schema's security is real: checks also try requests without it.
    return keys.create_key(session, "schemathesis").key


@pytest.mark.parametrize(("mode", "method", "path"), CASES, ids=[f"{m.value} {v} {p}" for m, v, p in CASES])
def test_operation_conforms(
    app: FastAPI, api_key: str, method: str, path: str, mode: schemathesis.GenerationMode
) -> None:
    config = schemathesis.Config.from_dict(CONFIG)
    operation = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {api_key}"})

    check()
