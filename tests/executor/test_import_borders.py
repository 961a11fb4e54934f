"""Static checks of the package borders (no import is executed: the source is parsed).

executor.runtime / executor.profile ship inside launch bundles that run where only torch is
installed, so they may import the standard library, torch, each other and the contract (which the
bundles carry too, and which imports the standard library alone), nothing else.
executor.launch runs inside the web service, so it must never import torch.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.executor.conftest import REPO

EXECUTOR = REPO / "executor"
STDLIB = set(sys.stdlib_module_names)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, including imports inside functions."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the file's package
                package = path.relative_to(REPO).with_suffix("").parts[: -node.level]
                found.append((node.lineno, ".".join((*package, node.module or ""))).rstrip("."))
            else:
                found.append((node.lineno, node.module or ""))
    return found


def files_of(package: str, root: Path = EXECUTOR) -> list[Path]:
    root = root / package
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


OPTIONAL = {
    "executor/runtime/loggers.py": {"wandb"},
    # The dataset writer (beside its reader, which needs neither): Hugging Face tokenizers if installed.
    "executor/runtime/prepare_data.py": {"transformers", "tokenizers"},
    # Float8 plans only (torchao, the executor extra); a plan needing it without it is refused by name.
    "executor/runtime/float8.py": {
        "torchao",
        "torchao.float8",
        "torchao.prototype.moe_training.config",
        "torchao.quantization",
        "torchao.quantization.quantize_.common.kernel_preference",
    },
}
"""Optional imports, each in one place, inside a function, guarded by `except ImportError`: the run goes
on without them (a one-line warning), or, for torchao, a plan that needs it is refused in one line."""


@pytest.mark.parametrize("package", ["runtime", "profile"])
def test_runtime_imports_only_stdlib_and_torch(package: str) -> None:
    files = files_of(package)
    if package == "runtime":
        assert len(files) >= 10, "the runtime package was not found"
    allowed_own = ("executor.runtime", "executor.profile", "contract")
    offenders = []
    for path in files:
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            if top in STDLIB or top == "torch" or module.startswith(allowed_own) or module == "executor":
                continue
            if module in OPTIONAL.get(path.relative_to(REPO).as_posix(), ()):
                continue
            offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert offenders == []


def test_the_contract_imports_only_the_standard_library() -> None:
    files = files_of("contract", REPO)
    assert len(files) >= 4, "the contract package was not found"
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.split(".")[0] not in STDLIB and not module.startswith("contract")
    ]
    assert offenders == []


def test_optional_imports_are_guarded() -> None:
    for relative, modules in OPTIONAL.items():
        tree = ast.parse((REPO / relative).read_text())
        guarded = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Try)
            and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers)
            for inner in node.body
            for alias in (
                inner.names if isinstance(inner, ast.Import)
                else [ast.alias(inner.module or "")] if isinstance(inner, ast.ImportFrom) else []
            )
        }
        assert modules <= guarded, relative


def test_border_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    # The checker itself must be able to fail.
    bad = REPO / "executor" / "runtime" / "_border_probe_tmp.py"
    bad.write_text("import numpy\nfrom planner.plan import Plan\n")
    try:
        modules = [m for _, m in imported_modules(bad)]
    finally:
        bad.unlink()
    assert modules == ["numpy", "planner.plan"]
    assert all(m.split(".")[0] not in STDLIB and m.split(".")[0] != "torch" for m in modules)


def test_launch_never_imports_torch() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files_of("launch")
        for line, module in imported_modules(path)
        if module.split(".")[0] == "torch" or module.startswith("executor.runtime")
    ]
    assert offenders == []


def test_bundle_runtime_is_the_whole_runtime_package() -> None:
    from executor.launch.bundle import runtime_files

    shipped = {f.path for f in runtime_files()}
    on_disk = {p.relative_to(REPO).as_posix() for p in (*files_of("runtime"), *files_of("contract", REPO))}
    assert on_disk <= shipped and "executor/__init__.py" in shipped
    assert not any(p.startswith(("executor/launch", "executor/profile")) for p in shipped)
