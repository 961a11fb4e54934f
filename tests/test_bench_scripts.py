"""The benchmark scripts under bench/ still import: they run on demand, so nothing else would notice
that one of them names a module or a function that moved (bench/study_jobs.py once imported
`database` from bench/jobs_fairness.py, inside a function, after it had become
bench/scratch_database.py's `scratch_database`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for path in (ROOT / "bench").glob("*.py") if path.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_name_a_script_imports_from_the_project_exists(script: Path) -> None:
    missing = []
    for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if node.module.split(".")[0] not in ("bench", "planner", "api", "executor", "contract"):
            continue
        module = importlib.import_module(node.module)
        missing += [
            f"{script.name}:{node.lineno}: {node.module}.{alias.name}"
            for alias in node.names
            if not hasattr(module, alias.name) and not _submodule(module, alias.name)
        ]
    assert not missing, "imported but not defined:\n" + "\n".join(missing)


def _submodule(package: object, name: str) -> bool:
    """Whether `name` is a module of `package` (`from package import module`), not yet imported."""
    if not hasattr(package, "__path__"):
        return False
    return importlib.util.find_spec(f"{package.__name__}.{name}") is not None


def test_the_check_finds_a_missing_name(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("def run():\n    from bench.scratch_database import database\n")
    with pytest.raises(AssertionError, match=r"bench\.scratch_database\.database"):
        test_every_name_a_script_imports_from_the_project_exists(script)
