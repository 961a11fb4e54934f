"""The documentation's examples are what the code prints. Every `fsdp-planner plan` and `whatif` shown
with its output is run, and every line it shows (each piece between `...` elisions) must be in what the
command prints, figures included; every plan request posted with `curl` and shown with the service's
answer is posted to the real app, and each field the answer shows must be what the service answers, to
the digits shown; the accuracy report's tables are the stored report's. An example that drifts fails
here, naming its page and line: run the command, and copy its output into the page."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from api.cli.main import app as cli
from api.settings import Settings
from tests.docs.conftest import DOCS, REPO

# The pages, and the README's tour.
DOCUMENTS = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
# Options whose files are the reader's own (a config.json, a traced graph, a profile): not runnable here.
READER_FILES = ("--hf-config", "--layer-graph", "--calibration", "--cluster-file", "--gpu-file")
WIDE = {"COLUMNS": "400"}  # rich wraps at the terminal's width; the pages show rows unwrapped


@dataclass(frozen=True, kw_only=True)
class Example:
    page: Path
    line: int
    command: str
    output: list[str]

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def code_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The code blocks of a page, indented or fenced: (line number of the first line, its lines, dedented)."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 0
    fence = False
    for number, line in enumerate([*text.splitlines(), "."], start=1):
        if line.startswith("```"):
            if fence:
                blocks.append((start, current))
                current = []
            fence = not fence
            start = number + 1
            continue
        if fence:
            current.append(line)
            continue
        if line.startswith("    ") or (current and not line.strip()):
            if not current:
                start = number
            current.append(line[4:])
            continue
        if current:
            while current and not current[-1].strip():
                current.pop()
            blocks.append((start, current))
            current = []
    return blocks


def examples(prefix: str) -> list[Example]:
    """Commands starting with `prefix` (after an optional `$ `), their continuation lines joined, with the
    lines that follow them in their block up to the next command; and a block of output alone whose
    paragraph just above names its command in one code span (`fsdp-planner plan ...`, then the block)."""
    found = []
    for page in DOCUMENTS:
        text = page.read_text(encoding="utf-8")
        for start, lines in code_blocks(text):
            if lines and PRINTOUT.match(lines[0]):
                command = inline_command(text, start, prefix)
                if command:
                    found.append(Example(page=page, line=start, command=command,
                                         output=[o for o in lines if o.strip()]))
                continue
            index = 0
            while index < len(lines):
                line = lines[index].removeprefix("$ ")
                if not line.startswith(prefix):
                    index += 1
                    continue
                first = index
                command = line
                while command.endswith("\\"):
                    index += 1
                    command = command[:-1] + " " + lines[index].strip()
                index += 1
                output = []
                while index < len(lines) and not is_command(lines[index]):
                    output.append(lines[index])
                    index += 1
                found.append(Example(page=page, line=start + first, command=command,
                                     output=[o for o in output if o.strip()]))
    return found


# The first line of what `plan` prints: its headline (`llama3-8b (8.03B params) on ...`) or a refusal.
PRINTOUT = re.compile(r"\S+ \([\d.]+[KMBT]? params|error: ")


def inline_command(text: str, block_start: int, prefix: str) -> str | None:
    """The one `prefix...` code span of the paragraph right above the block starting at `block_start`."""
    above = text.splitlines()[:block_start - 1]
    while above and (not above[-1].strip() or above[-1].startswith("```")):
        above.pop()
    paragraph: list[str] = []
    while above and above[-1].strip():
        paragraph.insert(0, above.pop())
    spans = re.findall(rf"`({re.escape(prefix)}[^`]*)`", " ".join(paragraph))
    return spans[0] if len(spans) == 1 else None


def is_command(line: str) -> bool:
    """A line the reader types (the next example in the block), not one the previous command printed."""
    return line.startswith(("$ ", "fsdp-planner ", "curl ", "cd ", "#"))


def words(text: str) -> str:
    return " ".join(text.split())


def shown_pieces(example: Example) -> list[str]:
    """What the output must contain: each line's pieces between `...` elisions (a refusal, wrapped by
    hand on the page, as one text), without the separators left at a cut."""
    lines = [" ".join(example.output)] if example.output[0].startswith("error:") else example.output
    pieces = []
    for line in lines:
        for piece in line.split("..."):
            piece = words(piece).strip(" ,;(")
            if len(piece.strip("│ ")) >= 3:
                pieces.append(piece)
    return pieces


PLAN_EXAMPLES = [e for e in [*examples("fsdp-planner plan "), *examples("fsdp-planner whatif ")]
                 if e.output and not any(option in e.command.split() for option in READER_FILES)]


def test_the_pages_show_plan_and_whatif_examples_with_their_output() -> None:
    pages = {e.page.relative_to(REPO).as_posix() for e in PLAN_EXAMPLES}
    assert {"docs/planning/index.md", "docs/planning/tensor-parallel.md",
            "docs/planning/pipeline-parallel.md", "docs/planning/context-parallel.md", "docs/quickstart.md",
            "docs/whatif.md", "README.md"} <= pages, pages


@pytest.mark.parametrize("example", PLAN_EXAMPLES, ids=str)
def test_a_plan_or_whatif_example_prints_what_its_page_shows(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = example.command.split()[1:]
    refused = example.output[0].startswith("error:")
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


@dataclass(frozen=True, kw_only=True)
class ApiExample:
    page: Path
    line: int
    body: dict[str, Any]
    shown: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def api_examples() -> list[ApiExample]:
    """`curl ... /api/v1/plans ... -d '{...}'` with the answer shown after it (a JSON object with the plan's
    figures)."""
    found = []
    for example in examples("curl "):
        text = "\n".join([example.command, *example.output])
        request = re.search(r"/api/v1/plans'? .*?-d '(\{.*?\})'", text, re.DOTALL)
        answer = re.search(r"^\{.*\"tokens_per_s_per_gpu\".*", text[request.end():] if request else "",
                           re.DOTALL | re.MULTILINE)
        if request and answer:
            found.append(ApiExample(page=example.page, line=example.line, body=json.loads(request[1]),
                                    shown=answer[0]))
    return found


API_EXAMPLES = api_examples()


def shown_fields(shown: str) -> dict[str, str]:
    """The top-level `"field":value` pairs an answer shows (a value: a number, a string, or a flat object)."""
    return dict(re.findall(r'"(\w+)":\s*("[^"]*"|\{[^{}]*\}|-?[\d.]+(?:e-?\d+)?)', shown))


def same_as_shown(shown: str, actual: Any) -> bool:
    value = json.loads(shown)
    if isinstance(value, dict):
        return isinstance(actual, dict) and all(actual.get(k) == v for k, v in value.items())
    if isinstance(value, float):
        digits = len(shown.split(".")[1]) if "." in shown else 0
        return isinstance(actual, int | float) and round(actual, digits) == value
    return actual == value


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
    fields = {k: v for k, v in shown_fields(example.shown).items() if k not in ("id", "plan")}
    assert {"tokens_per_s_per_gpu", "mfu"} <= fields.keys(), example
    for field, shown in fields.items():
        assert same_as_shown(shown, answer.get(field)), (
            f"{example} shows \"{field}\":{shown} where the service answers {answer.get(field)!r}")


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def report_rows(rows: list[dict[str, Any]], *, loso: bool) -> list[list[str]]:
    return [[r["group"], r["quantity"], str(r["runs"]), percent(r["mean_abs"]), percent(r["max_abs"]),
             percent(r["bias"]), *([percent(r["loso_mean_abs"])] if loso else [])] for r in rows]


def page_tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of a page, each a list of rows of cells (header and rule left out)."""
    tables: list[list[list[str]]] = []
    for block in re.findall(r"(?:^\|.*\|\n)+", text, re.MULTILINE):
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in block.splitlines()]
        tables.append(rows[2:])
    return tables


def test_the_fidelity_page_shows_the_stored_report() -> None:
    # The figures of the report the service serves (`fsdp-planner fidelity --write` stores it).
    report = json.loads((REPO / "planner" / "fidelity" / "report.json").read_text())
    page = (DOCS / "fidelity.md").read_text(encoding="utf-8")
    tables = page_tables(page)
    fit = report_rows(report["by_gpu"] + report["by_quantity"], loso=True)
    held_out = report_rows(report["held_out_by_gpu"] + report["held_out_by_quantity"], loso=False)
    assert fit in tables, f"docs/fidelity.md's fit table is not the stored report's:\n{fit}"
    assert held_out in tables, f"docs/fidelity.md's held-out table is not the stored report's:\n{held_out}"
    priced = sum(run["priced"] for run in report["runs"])
    assert f"{report['sources']} sources, {priced} of {len(report['runs'])} runs priced" in page
    for coverage in report["coverage"]:
        line = (f"80% interval: {coverage['covered']} of {coverage['runs']} held-out {coverage['quantity']} "
                f"runs inside ({coverage['fraction']:.0%})")
        assert line in page, line
