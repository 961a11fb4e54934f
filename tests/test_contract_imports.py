"""The contract package imports the standard library and itself alone: bundles carry it beside the
runtime onto machines that have neither the planner nor its dependencies. (The import-linter
contract in pyproject.toml names the project's other packages; this test also refuses any
third-party one.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CONTRACT = Path(__file__).resolve().parents[1] / "contract"


def imported_roots(path: Path) -> set[str]:
    """The top-level module of every import in a file (anywhere in it, functions included)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.partition(".")[0])
    return roots


def test_the_contract_imports_the_standard_library_and_itself_alone() -> None:
    allowed = set(sys.stdlib_module_names) | {"contract", "__future__"}
    files = sorted(CONTRACT.glob("*.py"))
    assert files, CONTRACT
    foreign = {f"{path.name}: {root}" for path in files for root in imported_roots(path) - allowed}
    assert not foreign, f"the contract imports beyond the standard library: {sorted(foreign)}"


def test_the_check_sees_a_third_party_import(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("import json\nfrom pydantic import BaseModel\n\ndef f():\n    import numpy\n")
    assert imported_roots(module) - set(sys.stdlib_module_names) == {"pydantic", "numpy"}
