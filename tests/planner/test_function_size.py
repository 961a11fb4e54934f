"""No function over 80 lines in the cost model or the launch bundles (issue 39): a longer one is
split into named steps, so that each step can be read, and tested, on its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MAX_LINES = 80
"""From the `def` line to the last line, docstring included (decorators not counted)."""


def long_functions(folder: str, *, root: Path = REPO) -> list[str]:
    """`path:line name (n lines)` for every function or method under `folder` over MAX_LINES."""
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    found.append(
                        f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({lines} lines)"
                    )
    return found


@pytest.mark.parametrize(
    "folder",
    ["planner/cost", "executor/launch"],
)
def test_no_function_is_over_80_lines(folder: str) -> None:
    assert (REPO / folder).is_dir()
    assert long_functions(folder) == []


def test_a_long_function_is_found(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_functions("pkg", root=tmp_path) == [f"pkg/long.py:5 long ({MAX_LINES + 1} lines)"]
