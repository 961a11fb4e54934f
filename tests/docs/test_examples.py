"""The documentation's examples are what the code prints. Every `fsdp-planner plan`, `whatif` and
`fidelity --no-loso` shown with its output is run, and every line it shows (each piece between `...`
elisions) must be in what the command prints, figures included; every plan request posted with `curl`
and shown with the service's answer is posted to the real app, and each field the answer shows must be
what the service answers, to the digits shown; the accuracy report's tables are the stored report's. An
example that drifts fails here, naming its page and line: `python scripts/refresh_doc_examples.py`
rewrites the figures from fresh output (the parsing is `tests/docs/examples.py`'s, shared with it), and
names what a human must fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from api.cli.main import app as cli
from api.settings import Settings
from tests.docs.examples import (
    DOCS,
    REPO,
    UNCHECKED_FIELDS,
    WIDE,
    ApiExample,
    Example,
    api_examples,
    is_refusal,
    page_tables,
    plan_examples,
    report_sentences,
    report_tables,
    same_as_shown,
    shown_fields,
    shown_pieces,
    words,
)

PLAN_EXAMPLES = plan_examples()


def test_the_pages_show_plan_and_whatif_examples_with_their_output() -> None:
    pages = {e.page.relative_to(REPO).as_posix() for e in PLAN_EXAMPLES}
    assert {"docs/planning/index.md", "docs/planning/tensor-parallel.md",
            "docs/planning/pipeline-parallel.md", "docs/planning/context-parallel.md", "docs/quickstart.md",
            "docs/whatif.md", "README.md"} <= pages, pages
    # The README's accuracy section quotes `fidelity`'s held-out tables as the command prints them.
    assert any(e.page.name == "README.md" and e.command.startswith("fsdp-planner fidelity")
               for e in PLAN_EXAMPLES)


@pytest.mark.parametrize("example", PLAN_EXAMPLES, ids=str)
def test_a_plan_or_whatif_example_prints_what_its_page_shows(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = example.command.split()[1:]
    refused = is_refusal(example)
    monkeypatch.chdir(tmp_path)  # an example's `-o plan.json` writes there, not into the checkout
    # Unwrapped first; a page that shows the table rows as printed at its own width is compared at it.
    for width in dict.fromkeys([WIDE["COLUMNS"], str(max(len(line) for line in example.output))]):
        result = CliRunner().invoke(cli, argv, env={"COLUMNS": width})
        assert result.exit_code in ((2, 3) if refused else (0,)), f"{example}: {result.output}"
        printed = words(result.output)
        drifted = [piece for piece in shown_pieces(example) if piece not in printed]
        if not drifted:
            break
    assert not drifted, f"{example} shows what the command does not print:\n" + "\n".join(
        drifted) + f"\n\nIt prints:\n{result.output}"


API_EXAMPLES = api_examples()


def test_the_pages_show_api_examples_with_their_answers() -> None:
    pages = {e.page.relative_to(REPO).as_posix() for e in API_EXAMPLES}
    assert {"docs/service/index.md", "docs/planning/tensor-parallel.md"} <= pages, pages


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    settings = Settings(data_dir=tmp_path_factory.mktemp("docs-examples"))
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize("example", API_EXAMPLES, ids=str)
def test_an_api_example_answers_what_its_page_shows(example: ApiExample, service: TestClient) -> None:
    response = service.post("/api/v1/plans", json=example.body)
    assert response.status_code in (200, 201), f"{example}: {response.text}"
    answer = response.json()
    fields = {k: v for k, v in shown_fields(example.shown).items() if k not in UNCHECKED_FIELDS}
    assert {"tokens_per_s_per_gpu", "mfu"} <= fields.keys(), example
    for field, shown in fields.items():
        assert same_as_shown(shown, answer.get(field)), (
            f"{example} shows \"{field}\":{shown} where the service answers {answer.get(field)!r}")


def test_the_fidelity_page_shows_the_stored_report() -> None:
    # The figures of the report the service serves (`fsdp-planner fidelity --write` stores it).
    report = json.loads((REPO / "planner" / "fidelity" / "report.json").read_text())
    page = (DOCS / "fidelity.md").read_text(encoding="utf-8")
    tables = page_tables(page)
    for name, rows in report_tables(report):
        assert rows in tables, f"docs/fidelity.md's {name} table is not the stored report's:\n{rows}"
    for sentence in report_sentences(report):
        assert sentence in page, sentence
