"""A stateful schemathesis run over the calibration and run routes, following the OpenAPI links.

Scenarios start from an upload of a calibration profile or a plan request (with a stored calibration
profile's id, by the `PlanWithCalibration` link), then read the profile back, delete it, list profiles,
and add runs to the plan and list them, each step's ids taken from the response before it, as a client
would chain them. Requests are valid and invalid (schemathesis mixes both), with the same checks and
configuration as `test_schemathesis.py` (no 5xx, responses as declared, valid data accepted, invalid
refused, ...), and a key stored, so that every write sends it. On SQLite and PostgreSQL.

With the fingerprint's bounds reverted (`num_nodes` and `gpus_per_node` any count, as before the fix),
it found in 16 s on SQLite: `POST /api/v1/calibrations` 500, `gpus_per_node` 257385149 (the fit's cluster).
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, settings
from sqlalchemy.orm import Session

from api import keys
from tests.api.conftest import CHEAP_PLAN, cpu_profile, empty_tables
from tests.api.test_schemathesis import CONFIG, pages_still_render, refused_only_for_unstatable_rules, tally

OPERATIONS = [
    "POST /api/v1/calibrations", "GET /api/v1/calibrations", "GET /api/v1/calibrations/{calibration_id}",
    "DELETE /api/v1/calibrations/{calibration_id}", "POST /api/v1/plans", "GET /api/v1/plans/{plan_id}",
    "POST /api/v1/plans/{plan_id}/runs", "GET /api/v1/plans/{plan_id}/runs",
]
# Scenarios and steps per scenario: a few hundred requests, about a minute per database on a loaded
# 2-core machine; FSDP_PLANNER_SCHEMATHESIS_SCENARIOS raises it for a longer run.
SCENARIOS = int(os.environ.get("FSDP_PLANNER_SCHEMATHESIS_SCENARIOS", "80"))
STEPS = 10
IN_USE = {
    # A scenario that planned with a profile then deletes it: valid, and refused while the plan stands.
    "include-name": "DELETE /api/v1/calibrations/{calibration_id}",
    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "409"]}},
}


def aimed_at_real_rows(case: schemathesis.Case) -> None:
    """Every other valid upload or plan request made one the server can store: a random profile is
    refused for its measurements (no JSON schema states which timings are physical) and a random plan
    for its model, so without this no scenario would get past its first step. The generated
    fingerprint and the linked calibration id stay as generated: a real profile measured on the
    generated hardware, a cheap plan with the profile the link names."""
    if case.meta is None or not case.meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return
    # A coin drawn from the generated body (not the linked id, which differs between databases), so
    # that a replayed scenario makes the same requests.
    drawn = {key: value for key, value in case.body.items() if key != "calibration_id"}
    if zlib.crc32(json.dumps(drawn, sort_keys=True, default=str).encode()) % 2:
        return
    if case.operation.label == "POST /api/v1/calibrations":
        real = cpu_profile()
        case.body = {**real, "fingerprint": {**real["fingerprint"], **case.body.get("fingerprint", {})}}
    elif case.operation.label == "POST /api/v1/plans":
        linked = {"calibration_id": case.body["calibration_id"]} if "calibration_id" in case.body else {}
        case.body = {**CHEAP_PLAN, **linked}


def test_calibration_and_run_scenarios(app: FastAPI, session: Session) -> None:
    api_key = keys.create_key(session, "schemathesis-stateful").key
    config = schemathesis.Config.from_dict({**CONFIG, "operations": [*CONFIG["operations"], IN_USE]})
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config).exclude(
        func=lambda ctx: ctx.operation.label not in OPERATIONS  # `include` would widen the config's selection
    )
    checks = [tally, pages_still_render(app), refused_only_for_unstatable_rules]

    class Scenarios(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Each scenario starts from the same empty database (the key kept): Hypothesis replays a
            # scenario's draws and expects the same answers.
            empty_tables(app, keep=("api_keys",))

        def before_call(self, case: schemathesis.Case) -> None:
            aimed_at_real_rows(case)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": {"Authorization": f"Bearer {api_key}"}}

        def validate_response(self, response: Any, case: schemathesis.Case, **kwargs: Any) -> None:
            super().validate_response(response, case, additional_checks=checks, **kwargs)

    Scenarios.run(settings=settings(
        max_examples=SCENARIOS,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    ))
