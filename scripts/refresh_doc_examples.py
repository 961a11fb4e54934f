#!/usr/bin/env python
"""Refresh the documentation's examples from what the code prints now.

Finds the examples `tests/docs/test_examples.py` checks (the same parsing: `tests/docs/examples.py`):
every `fsdp-planner plan` / `whatif` / `fidelity --no-loso` shown with its output, every `curl` to
`POST /api/v1/plans` shown with the service's answer, and the accuracy report's tables on
`docs/fidelity.md`. It runs each
command as the test does (the CLI in-process, 400 columns wide, in a scratch directory; a page that
shows rows at its own width is matched at that width too), posts each request to the real app, and
rewrites each shown line in place with its line of the new output: a shown line is matched to a printed
one by its skeleton (its text with the figures and the spacing free), in the order the page shows
them, so the page keeps its `...` elisions and its choice of lines. A line whose skeleton nothing
printed has (a new warning, another runner-up) is reported with the command's output and left as it
is for a human. Nothing outside the examples' code blocks and the report's tables is written; the
report's sentences in the page's prose (`24 sources, 121 of 178 runs priced`, the coverage lines) are
reported when they drift, not rewritten.

    python scripts/refresh_doc_examples.py            # rewrite the pages, report what is left
    python scripts/refresh_doc_examples.py --check    # report the drift, write nothing (exit 1 if any)
    python scripts/refresh_doc_examples.py docs/moe.md README.md   # only these pages

Exit status: 0 when every example matches (or was rewritten to), 1 when drift is left (`--check`) or a
line needs a human.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests package (its parsing) and the project, run from anywhere

from tests.docs import examples as ex  # noqa: E402


@dataclass
class PageEdits:
    """The rewrites of one page: its line number -> the lines that replace it (several for a refusal
    re-wrapped, none for a line folded into the one above), and what is left for a human."""
    page: Path
    lines: dict[int, list[str]] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)


@contextmanager
def scratch_directory() -> Iterator[Path]:
    """Where a command runs, so that an example's `-o plan.json` writes there, not into the checkout."""
    previous = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="doc-examples-") as directory:
        os.chdir(directory)
        try:
            yield Path(directory)
        finally:
            os.chdir(previous)


def run_command(example: ex.Example, width: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from api.cli.main import app as cli
    with scratch_directory():
        result = CliRunner().invoke(cli, example.command.split()[1:], env={"COLUMNS": width})
    return result.exit_code, result.output


def refresh_plan_example(example: ex.Example, edits: PageEdits) -> None:
    """Rewrite one command's shown output from a fresh run, or record what could not be matched."""
    refused = ex.is_refusal(example)
    best: tuple[int, list[ex.Refreshed] | list[str] | None, str] | None = None
    for width in dict.fromkeys([ex.WIDE["COLUMNS"], str(max(len(line) for line in example.output))]):
        code, printed = run_command(example, width)
        if code not in ((2, 3) if refused else (0,)):
            edits.left.append(f"{example}: `{example.command}` exits {code}:\n{printed}")
            return
        if refused:
            lines = ex.refresh_refusal(example.output, printed)
            unmatched = 0 if lines is not None else 1
            candidate: tuple[int, list[ex.Refreshed] | list[str] | None, str] = (unmatched, lines, printed)
        else:
            refreshed = ex.refresh_lines(example.output, printed.splitlines())
            candidate = (sum(r.new is None for r in refreshed), refreshed, printed)
        if best is None or candidate[0] < best[0]:
            best = candidate
        if candidate[0] == 0:
            break
    assert best is not None
    unmatched, result, printed = best
    if refused:
        if result is None:
            edits.left.append(f"{example}: the refusal shown is not what `{example.command}` prints:\n"
                              f"{printed}")
            return
        refusal = list(result)
        assert all(isinstance(line, str) for line in refusal)
        if refusal != example.output:
            numbers = example.output_lines
            edits.lines[numbers[0]] = [str(line) for line in refusal]
            for number in numbers[1:]:
                edits.lines[number] = []
        return
    missing = []
    for number, refreshed in zip(example.output_lines, result or [], strict=True):
        assert isinstance(refreshed, ex.Refreshed)
        if refreshed.new is None:
            missing.append(f"  line {number}: {refreshed.shown.strip()}")
        elif refreshed.new != refreshed.shown:
            edits.lines[number] = [refreshed.new]
    if missing:
        edits.left.append(f"{example}: no line of `{example.command}`'s output has the skeleton of\n"
                          + "\n".join(missing) + f"\nIt prints:\n{printed}")


def refresh_api_examples(pages: list[Path], edits: dict[Path, PageEdits]) -> None:
    """Post each request shown with `curl` to the real app and rewrite the fields its answer shows."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import Settings
    found = ex.api_examples(pages)
    if not found:
        return
    with tempfile.TemporaryDirectory(prefix="doc-examples-") as data, \
            TestClient(create_app(Settings(data_dir=Path(data)))) as client:
        for example in found:
            response = client.post("/api/v1/plans", json=example.body)
            if response.status_code not in (200, 201):
                edits[example.page].left.append(f"{example}: the service answers {response.status_code}: "
                                                f"{response.text}")
                continue
            answer = response.json()
            for number, line in example.answer_lines:
                new = ex.refresh_answer_line(line, answer)
                if new != line:
                    edits[example.page].lines[number] = [new]
            shown = ex.shown_fields(example.shown)
            for name, value in shown.items():
                if name not in ex.UNCHECKED_FIELDS and ex.as_shown(value, answer.get(name)) is None:
                    edits[example.page].left.append(
                        f"{example}: \"{name}\":{value} cannot be written from the answer's "
                        f"{answer.get(name)!r}")


def markdown_row(cells: list[str], like: str) -> str:
    """A table row in the page's own style (`| a | b |`)."""
    return "| " + " | ".join(cells) + " |" if like.startswith("| ") else "|" + "|".join(cells) + "|"


def refresh_report_tables(edits: PageEdits) -> None:
    """Rewrite the accuracy page's report tables (fit, held-out, GPU types no fit run measured) from the
    stored report: each table is the report's rows whole, so its body is replaced, in the page's table
    with the report's columns that shares most rows with it. The report's sentences in the prose are
    only checked."""
    report = json.loads((REPO / "planner" / "fidelity" / "report.json").read_text(encoding="utf-8"))
    text = edits.page.read_text(encoding="utf-8")
    tables = []  # (first body line number, body lines, rows) of each table
    for match in ex.TABLE.finditer(text):
        first = text.count("\n", 0, match.start()) + 1
        lines = match[0].splitlines()
        tables.append((first + 2, lines[2:], [ex.table_cells(line) for line in lines[2:]]))
    used: set[int] = set()
    for name, rows in ex.report_tables(report):
        columns = len(rows[0])
        keys = {tuple(row[:2]) for row in rows}
        # The table with the report's columns that shares most rows (then most GPU/quantity pairs) with it.
        candidates = [(sum(row in rows for row in t[2]), len(keys & {tuple(r[:2]) for r in t[2]}), i)
                      for i, t in enumerate(tables) if i not in used and t[2] and len(t[2][0]) == columns]
        if not candidates:
            edits.left.append(f"{edits.page.relative_to(REPO)}: no {name} table ({columns} columns) "
                              "to refresh")
            continue
        *_, index = max(candidates)
        used.add(index)
        first, body, current = tables[index]
        if current == rows:
            continue
        new = [markdown_row(row, body[0]) for row in rows]
        edits.lines[first] = new
        for number in range(first + 1, first + len(body)):
            edits.lines[number] = []
    for sentence in ex.report_sentences(report):
        if sentence not in text:
            edits.left.append(f"{edits.page.relative_to(REPO)}: the prose must state the stored report's "
                              f"`{sentence}` (written by hand: the tool leaves prose alone)")


def editable_lines(page: Path, text: str) -> set[int]:
    """The page's lines the tool may write: those of its code blocks and of its tables."""
    allowed = {start + i for start, lines in ex.code_blocks(text) for i in range(len(lines))}
    for match in ex.TABLE.finditer(text):
        first = text.count("\n", 0, match.start()) + 1
        allowed |= set(range(first, first + match[0].count("\n")))
    return allowed


def apply(edits: PageEdits, blocks_of: dict[int, str]) -> str:
    """The page with its edits: each replaced line keeps the page's indent before the shown text."""
    text = edits.page.read_text(encoding="utf-8")
    allowed = editable_lines(edits.page, text)
    lines = text.split("\n")
    out: list[str] = []
    for number, line in enumerate(lines, start=1):
        if number not in edits.lines:
            out.append(line)
            continue
        if number not in allowed:
            raise SystemExit(f"{edits.page}:{number} is prose; the tool only writes code blocks and tables")
        shown = blocks_of.get(number)
        indent = line[:len(line) - len(shown)] if shown is not None and line.endswith(shown) else ""
        out.extend(indent + new for new in edits.lines[number])
    return "\n".join(out)


def dedented_lines(text: str) -> dict[int, str]:
    """Each code-block line of a page as the parsing sees it (indent removed), by line number."""
    return {start + i: line for start, lines in ex.code_blocks(text) for i, line in enumerate(lines)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to refresh (default: README.md and docs/)")
    parser.add_argument("--check", action="store_true", help="report the drift, write nothing")
    args = parser.parse_args(argv)
    pages = [p.resolve() for p in args.pages] if args.pages else ex.DOCUMENTS
    outside = [p for p in pages if p not in ex.DOCUMENTS]
    if outside:
        parser.error(f"not a page the test reads: {', '.join(map(str, outside))}")
    edits = {page: PageEdits(page=page) for page in pages}
    for example in ex.plan_examples():
        if example.page in edits:
            print(f"running {example}: {example.command}", file=sys.stderr)
            refresh_plan_example(example, edits[example.page])
    refresh_api_examples(pages, edits)
    if ex.DOCS / "fidelity.md" in edits:
        refresh_report_tables(edits[ex.DOCS / "fidelity.md"])

    drifted = left = 0
    for page, page_edits in edits.items():
        name = page.relative_to(REPO).as_posix()
        text = page.read_text(encoding="utf-8")
        if page_edits.lines:
            new = apply(page_edits, dedented_lines(text))
            if new != text:
                drifted += 1
                if args.check:
                    sys.stdout.writelines(difflib.unified_diff(text.splitlines(keepends=True),
                                                               new.splitlines(keepends=True),
                                                               f"a/{name}", f"b/{name}"))
                else:
                    page.write_text(new, encoding="utf-8")
                    print(f"rewrote {name} ({len(page_edits.lines)} lines)")
        for message in page_edits.left:
            left += 1
            print(f"\nLEFT FOR A HUMAN: {message}")
    print(f"\n{drifted} page(s) {'drifted' if args.check else 'rewritten'}, {left} thing(s) left for a human",
          file=sys.stderr)
    return 1 if left or (args.check and drifted) else 0


if __name__ == "__main__":
    sys.exit(main())
