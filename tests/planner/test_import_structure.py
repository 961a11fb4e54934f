"""The planner's import structure: every import at module level, and no circle between its modules.

An import placed inside a function hides a circle instead of removing it (issue 23): the first
test refuses one, the second builds the graph of the planner's module-level imports and refuses a
cycle, naming it. Imports under a module-level `if TYPE_CHECKING:` run for type checkers only and
count for neither.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANNER = ROOT / "planner"

ALLOWED_IN_FUNCTION: dict[tuple[str, str], str] = {}
"""(file, imported module) -> why the import still stays inside a function. Only shrink it."""


def _modules() -> dict[str, Path]:
    """Every planner module by dotted name (a package by its own name, from its __init__.py)."""
    found = {}
    for path in sorted(PLANNER.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (not those for type checkers only)."""
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _allowed_positions(tree: ast.Module) -> set[int]:
    allowed = {id(n) for n in tree.body}
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node):
            allowed |= {id(n) for n in node.body}
    return allowed


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Dotted names `node` imports (for `from x import y`, both x and x.y: y may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _graph() -> dict[str, set[str]]:
    """Module -> the planner modules its module-level imports run (a module's packages included:
    importing planner.catalog.gpus runs planner/catalog/__init__.py first)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets: set[str] = set()
        for node in _module_level_imports(tree):
            for target in _imported(node, name, path.name == "__init__.py"):
                parts = target.split(".")
                targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()
        graph[name] = targets - {name} - {p for p in _parents(name)}
    return graph


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path that leaves the component's first module and comes back, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(component)} is no cycle")


def test_every_planner_import_is_at_module_level() -> None:
    found = []
    for path in _modules().values():
        tree = ast.parse(path.read_text(), filename=str(path))
        allowed = _allowed_positions(tree)
        file = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in allowed:
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (file, module or "") not in ALLOWED_IN_FUNCTION:
                    found.append(f"{file}:{node.lineno}: {ast.unparse(node)}")
    assert not found, (
        "imports inside functions or classes (they hide an import circle; move the code so that the "
        "import can be at module level):\n" + "\n".join(found)
    )


def test_the_allowed_in_function_imports_are_still_there() -> None:
    # An entry left behind would let a new import of the same module in through the same file.
    present = set()
    for path in _modules().values():
        tree = ast.parse(path.read_text(), filename=str(path))
        allowed = _allowed_positions(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in allowed:
                present.add((str(path.relative_to(ROOT)), node.module or ""))
    assert set(ALLOWED_IN_FUNCTION) <= present, set(ALLOWED_IN_FUNCTION) - present


def test_the_planner_has_no_import_cycle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles between planner modules:\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_the_cycle_check_finds_a_cycle() -> None:
    # The check itself: a circle through three modules (and one through a package) is named.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "p": {"p.m"}, "p.m": {"p"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c", "a"], ["p", "p.m", "p"]]
