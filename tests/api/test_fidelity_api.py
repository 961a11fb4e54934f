"""GET /api/v1/fidelity: the stored fidelity report, its runs filtered by GPU type and source."""

from __future__ import annotations

import json

import httpx
import pytest

from api.services.fidelity import KNOWN_GPUS, KNOWN_SOURCES
from planner.fidelity.report import report_json, stored_report
from tests.api.conftest import assert_problem

pytestmark = pytest.mark.anyio

FIDELITY = "/api/v1/fidelity"


async def test_serves_the_stored_report(client: httpx.AsyncClient) -> None:
    response = await client.get(FIDELITY)
    assert response.status_code == 200, response.text
    assert response.json() == stored_report().model_dump(mode="json")
    # The same document `fsdp-planner fidelity --json` prints.
    assert response.json() == json.loads(report_json(stored_report()))


async def test_filters_narrow_the_runs_only(client: httpx.AsyncClient) -> None:
    stored = stored_report()
    gpu, source = stored.runs[0].gpu, stored.runs[0].source
    by_gpu = (await client.get(FIDELITY, params={"gpu": gpu})).json()
    assert by_gpu["runs"] and {r["gpu"] for r in by_gpu["runs"]} == {gpu}
    assert len(by_gpu["runs"]) == sum(1 for r in stored.runs if r.gpu == gpu)
    assert by_gpu["by_gpu"] == stored.model_dump(mode="json")["by_gpu"]  # summaries: the whole corpus
    both = (await client.get(FIDELITY, params={"gpu": gpu, "source": source})).json()
    assert both["runs"] and {(r["gpu"], r["source"]) for r in both["runs"]} == {(gpu, source)}
    assert len(both["runs"]) == sum(1 for r in stored.runs if (r.gpu, r.source) == (gpu, source))
    # A catalog GPU that no run used: no runs, not an error.
    unused = next(name for name in KNOWN_GPUS if all(r.gpu != name for r in stored.runs))
    assert (await client.get(FIDELITY, params={"gpu": unused})).json()["runs"] == []


@pytest.mark.parametrize(("parameter", "known"), [("gpu", KNOWN_GPUS), ("source", KNOWN_SOURCES)])
async def test_an_unknown_filter_is_a_422_naming_it_and_the_known_values(
    client: httpx.AsyncClient, parameter: str, known: tuple[str, ...]
) -> None:
    problem = assert_problem(await client.get(FIDELITY, params={parameter: "no-such-thing"}), 422,
                             "invalid-request")
    assert problem["detail"].startswith(f"{parameter}: 'no-such-thing'")
    assert all(value in problem["detail"] for value in known)
    assert [(e["location"], e["field"]) for e in problem["errors"]] == [("query", parameter)]


async def test_the_filters_are_documented_with_their_values(client: httpx.AsyncClient) -> None:
    operation = (await client.get("/openapi.json")).json()["paths"][FIDELITY]["get"]
    parameters = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert parameters["gpu"]["enum"] == list(KNOWN_GPUS)
    assert parameters["source"]["enum"] == list(KNOWN_SOURCES)
    assert "422" in operation["responses"]
