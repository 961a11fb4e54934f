"""The documentation's examples: where the pages show a command with what it prints, a `curl` with the
service's answer, or the accuracy report's tables, and how a shown line is matched to a line of fresh
output. `tests/docs/test_examples.py` checks them and `scripts/refresh_doc_examples.py` rewrites them
from the same parsing, so what the tool refreshes is exactly what the test reads."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

# The pages, and the README's tour.
DOCUMENTS = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
# Options whose files are the reader's own (a config.json, a traced graph, a profile): not runnable here.
READER_FILES = ("--hf-config", "--layer-graph", "--calibration", "--cluster-file", "--gpu-file")
WIDE = {"COLUMNS": "400"}  # rich wraps at the terminal's width; the pages show rows unwrapped
ELISION = "..."


@dataclass(frozen=True, kw_only=True)
class Example:
    page: Path
    line: int
    command: str
    output: list[str]
    # The page's line number of each line of `output` (1-based), for the tool that rewrites them.
    output_lines: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def code_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The code blocks of a page, indented or fenced: (line number of the first line, its lines, dedented).
    The lines of a block are the page's consecutive lines from that number on."""
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


def page_examples(page: Path, prefix: str, text: str | None = None) -> list[Example]:
    """One page's examples of commands starting with `prefix` (see `examples`)."""
    text = page.read_text(encoding="utf-8") if text is None else text
    found = []
    for start, lines in code_blocks(text):
        if lines and PRINTOUT.match(lines[0]):
            command = inline_command(text, start, prefix)
            if command:
                shown = [(start + i, o) for i, o in enumerate(lines) if o.strip()]
                found.append(Example(page=page, line=start, command=command, output=[o for _, o in shown],
                                     output_lines=tuple(n for n, _ in shown)))
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
                if lines[index].strip():
                    output.append((start + index, lines[index]))
                index += 1
            found.append(Example(page=page, line=start + first, command=command,
                                 output=[o for _, o in output], output_lines=tuple(n for n, _ in output)))
    return found


def examples(prefix: str) -> list[Example]:
    """Commands starting with `prefix` (after an optional `$ `), their continuation lines joined, with the
    lines that follow them in their block up to the next command; and a block of output alone whose
    paragraph just above names its command in one code span (`fsdp-planner plan ...`, then the block)."""
    return [example for page in DOCUMENTS for example in page_examples(page, prefix)]


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


def is_refusal(example: Example) -> bool:
    return example.output[0].startswith("error:")


def shown_pieces(example: Example) -> list[str]:
    """What the output must contain: each line's pieces between `...` elisions (a refusal, wrapped by
    hand on the page, as one text), without the separators left at a cut."""
    lines = [" ".join(example.output)] if is_refusal(example) else example.output
    pieces = []
    for line in lines:
        for piece in line.split(ELISION):
            piece = words(piece).strip(" ,;(")
            if len(piece.strip("│ ")) >= 3:
                pieces.append(piece)
    return pieces


def runnable(example: Example) -> bool:
    """An example the test runs: it shows output, and it names no file of the reader's own."""
    return bool(example.output) and not any(option in example.command.split() for option in READER_FILES)


# The commands whose shown output is checked: `fidelity` without its leave-one-source-out refits (a
# second; with them, about a minute).
CHECKED_COMMANDS = ("fsdp-planner plan ", "fsdp-planner whatif ", "fsdp-planner fidelity --no-loso")


def plan_examples() -> list[Example]:
    return [e for prefix in CHECKED_COMMANDS for e in examples(prefix) if runnable(e)]


# ---- The service's answers -------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ApiExample:
    page: Path
    line: int
    body: dict[str, Any]
    shown: str
    # The page's line numbers and (dedented) lines of the answer shown.
    answer_lines: tuple[tuple[int, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def api_examples(documents: list[Path] | None = None) -> list[ApiExample]:
    """`curl ... /api/v1/plans ... -d '{...}'` with the answer shown after it (a JSON object with the plan's
    figures)."""
    found = []
    for page in DOCUMENTS if documents is None else documents:
        for example in page_examples(page, "curl "):
            text = "\n".join([example.command, *example.output])
            request = re.search(r"/api/v1/plans'? .*?-d '(\{.*?\})'", text, re.DOTALL)
            answer = re.search(r"^\{.*\"tokens_per_s_per_gpu\".*", text[request.end():] if request else "",
                               re.DOTALL | re.MULTILINE)
            if request and answer:
                first = next(i for i, line in enumerate(example.output) if line.startswith("{"))
                found.append(ApiExample(
                    page=example.page, line=example.line, body=json.loads(request[1]), shown=answer[0],
                    answer_lines=tuple(zip(example.output_lines[first:], example.output[first:],
                                           strict=True))))
    return found


# A top-level `"field":value` pair an answer shows (a value: a number, a string, or a flat object).
FIELD = re.compile(r'"(\w+)":\s*("[^"]*"|\{[^{}]*\}|-?[\d.]+(?:e-?\d+)?)')
UNCHECKED_FIELDS = ("id", "plan")  # the row's number, and the Plan JSON elided


def shown_fields(shown: str) -> dict[str, str]:
    """The top-level `"field":value` pairs an answer shows."""
    return dict(FIELD.findall(shown))


def same_as_shown(shown: str, actual: Any) -> bool:
    value = json.loads(shown)
    if isinstance(value, dict):
        return isinstance(actual, dict) and all(actual.get(k) == v for k, v in value.items())
    if isinstance(value, float):
        digits = len(shown.split(".")[1]) if "." in shown else 0
        return isinstance(actual, int | float) and round(actual, digits) == value
    return actual == value


def as_shown(shown: str, actual: Any) -> str | None:
    """`actual` written the way the page writes `shown` (a float to the same digits, an object's fields
    in the page's order), or None when it cannot be (another type, a field the answer lacks)."""
    value = json.loads(shown)
    if isinstance(value, dict):
        if not isinstance(actual, dict) or not set(value) <= set(actual):
            return None
        return json.dumps({k: actual[k] for k in value}, separators=(",", ":"))
    if isinstance(value, float) and "e" not in shown.lower():
        if not isinstance(actual, int | float):
            return None
        return f"{actual:.{len(shown.split('.')[1])}f}"
    if isinstance(value, bool | str) or value is None:
        return json.dumps(actual) if type(actual) is type(value) else None
    if isinstance(value, int):
        return str(actual) if isinstance(actual, int) and not isinstance(actual, bool) else None
    return None


def refresh_answer_line(line: str, answer: dict[str, Any]) -> str:
    """A shown line of an answer with each field it shows (but `id` and `plan`) written from `answer`;
    a field that cannot be written the page's way keeps its shown value (the test names it)."""
    def field(match: re.Match[str]) -> str:
        name, shown = match[1], match[2]
        if name in UNCHECKED_FIELDS or name not in answer or same_as_shown(shown, answer[name]):
            return match[0]
        value = as_shown(shown, answer[name])
        return match[0] if value is None else match[0][:match.start(2) - match.start(0)] + value
    return FIELD.sub(field, line)


# ---- The accuracy report's tables ------------------------------------------------------------------

def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def report_rows(rows: list[dict[str, Any]], *, loso: bool) -> list[list[str]]:
    return [[r["group"], r["quantity"], str(r["runs"]), percent(r["mean_abs"]), percent(r["max_abs"]),
             percent(r["bias"]), *([percent(r["loso_mean_abs"])] if loso else [])] for r in rows]


def fit_rows(report: dict[str, Any]) -> list[list[str]]:
    return report_rows(report["by_gpu"] + report["by_quantity"], loso=True)


def held_out_rows(report: dict[str, Any]) -> list[list[str]]:
    return report_rows(report["held_out_by_gpu"] + report["held_out_by_quantity"], loso=False)


def unseen_gpu_rows(report: dict[str, Any]) -> list[list[str]]:
    """The table of the GPU types no fit run measured (dense and mixture-of-experts runs together)."""
    return report_rows(report["unseen_gpu_by_gpu"], loso=False)


def report_tables(report: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """The report's tables the accuracy page shows, by name, in the page's order."""
    return [("fit", fit_rows(report)), ("held-out", held_out_rows(report)),
            ("GPU types no fit run measured", unseen_gpu_rows(report))]


TABLE = re.compile(r"(?:^\|.*\|\n)+", re.MULTILINE)


def table_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def page_tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of a page, each a list of rows of cells (header and rule left out)."""
    return [[table_cells(line) for line in block.splitlines()][2:] for block in TABLE.findall(text)]


def report_sentences(report: dict[str, Any]) -> list[str]:
    """The report's sentences the accuracy page must state word for word: its corpus, and each held-out
    coverage line."""
    priced = sum(run["priced"] for run in report["runs"])
    return [f"{report['sources']} sources, {priced} of {len(report['runs'])} runs priced",
            *(f"80% interval: {c['covered']} of {c['runs']} held-out {c['quantity']} runs inside "
              f"({c['fraction']:.0%})" for c in report["coverage"])]


# ---- Matching a shown line to fresh output ---------------------------------------------------------

# A figure: a number standing alone (not inside a name like `dp8x1`, `ag512/rs512MB` or `1x8`), with
# its sign, thousands commas, decimals and a one-letter scale or `x` (`29.5M`, `1.26x`); or a plan's
# hash (`plan 334a98e0a78c`: 12 hex digits), which moves with the planner's version.
FIGURE = r"(?<![\w.])(?:[-+−]?\d[\d,]*(?:\.\d+)?[kKMBTx]?|[0-9a-f]{12})(?![\w])"
_TOKEN = re.compile(rf"(?P<figure>{FIGURE})|(?P<space>\s+)|(?P<other>.)", re.DOTALL)


def skeleton(text: str) -> str:
    """A shown text with its figures as `#` and its spacing as one blank: what must stay the same for a
    line of new output to be the same line with new figures."""
    return "".join("#" if m["figure"] else " " if m["space"] else m["other"] for m in _TOKEN.finditer(text))


def piece_pattern(piece: str) -> re.Pattern[str]:
    """A regular expression that finds `piece` in new output whatever its figures and spacing now are."""
    parts = []
    for m in _TOKEN.finditer(piece.strip()):
        parts.append(FIGURE if m["figure"] else r"\s+" if m["space"] else re.escape(m["other"]))
    return re.compile("".join(parts))


def substantive(piece: str) -> bool:
    """A piece worth matching (the test reads it): not only the separators left at an elision."""
    return len(words(piece).strip(" ,;(").strip("│ ")) >= 3


def match_line(shown: str, printed: str, *, whole: bool) -> str | None:
    """`shown` rewritten from `printed` when the two are the same line (each piece between elisions found
    in order, figures and spacing free; `whole`: a line without elisions must be all of `printed`), or
    None. Elisions, the spacing around them, and pieces too short to match stay as shown."""
    pieces = shown.split(ELISION)
    if whole and len(pieces) == 1:
        match = piece_pattern(shown).fullmatch(printed.strip())
        if not match:
            return None
        return shown[:len(shown) - len(shown.lstrip())] + match[0]
    new: list[str] = []
    position = 0
    for piece in pieces:
        if not substantive(piece):
            new.append(piece)
            continue
        match = piece_pattern(piece).search(printed, position)
        if not match:
            return None
        position = match.end()
        lead = piece[:len(piece) - len(piece.lstrip())]
        trail = piece[len(piece.rstrip()):]
        new.append(lead + match[0] + trail)
    return ELISION.join(new)


WRAPPED_LINES = 4  # the most printed lines one shown line may join


@dataclass(frozen=True, kw_only=True)
class Refreshed:
    """A shown line's fate: `new` is the line from new output (the same when nothing drifted), or None
    when no line of the output has its skeleton (left for a human)."""
    shown: str
    new: str | None


def refresh_lines(shown: list[str], printed: list[str]) -> list[Refreshed]:
    """Each shown line matched to a line of `printed`, in order: a line is looked for after the previous
    match (the page shows lines in the order they print), first as a whole line, then as a part of one,
    then across a few printed lines the printout wrapped; a line with nothing to match (`│ ...`) stays
    as it is."""
    result = []
    cursor = 0
    for line in shown:
        if not any(substantive(piece) for piece in line.split(ELISION)):
            result.append(Refreshed(shown=line, new=line))
            continue
        found = None
        for whole in (True, False):
            for index in range(cursor, len(printed)):
                new = match_line(line, printed[index], whole=whole)
                if new is not None:
                    found = (index, new)
                    break
            if found:
                break
        # A line the printout wrapped (a table's title at the table's width), read as one.
        for span in range(2, WRAPPED_LINES + 1):
            if found:
                break
            for index in range(cursor, len(printed) - span + 1):
                new = match_line(line, words(" ".join(printed[index:index + span])), whole=False)
                if new is not None:
                    found = (index + span - 1, new)
                    break
        if found is None:
            result.append(Refreshed(shown=line, new=None))
            continue
        cursor = found[0] + 1
        result.append(Refreshed(shown=line, new=found[1]))
    return result


def refresh_refusal(shown: list[str], printed: str) -> list[str] | None:
    """A refusal wrapped by hand on the page, rewritten from `printed`; None when its skeleton is not what
    was printed. The same words end each line as on the page (a figure matches one word)."""
    text = " ".join(line.strip() for line in shown)
    new = match_line(text, words(printed), whole=False)
    if new is None:
        return None
    new_words = words(new).split(" ")
    lines, start = [], 0
    for line in shown:
        count = len(line.split())
        lines.append(line[:len(line) - len(line.lstrip())] + " ".join(new_words[start:start + count]))
        start += count
    return lines
