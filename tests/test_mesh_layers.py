"""Every axis of the mesh has its one place in every layer: the new-dimension checklist, as a test.

The mesh's axes are declared once (`contract.mesh.Mesh`, `MESH_AXES`). Each layer below names, per
axis, the one function that applies it there, or why the axis does not apply to it. A new field on
`Mesh` (expert parallelism, say) fails this test until every layer has its entry, and an
entry fails when its function never reads its axis (the source is parsed, nothing is imported: the
runtime's files need torch). The README's "Adding a parallel dimension" section is this checklist in
prose.
"""

from __future__ import annotations

import ast
import dataclasses
from functools import cache
from pathlib import Path

from contract.mesh import MESH_AXES, Mesh

REPO = Path(__file__).resolve().parents[1]

Handler = tuple[str, str]
"""(file relative to the repository, function or `Class.method` there) that applies an axis."""

LAYERS: dict[str, dict[str, Handler | str]] = {
    "search axis": {
        "pp": ("planner/enumeration.py", "pipeline_parallel_degrees"),
        "dp_replicate": ("planner/enumeration.py", "data_parallel_meshes"),
        "dp_shard": ("planner/enumeration.py", "data_parallel_meshes"),
        "cp": ("planner/enumeration.py", "context_parallel_degrees"),
        "tp": ("planner/enumeration.py", "tensor_parallel_degrees"),
    },
    "cost term": {
        "pp": ("planner/cost/estimate.py", "Estimator._pipeline_timing"),  # the bubble and the sends
        "dp_replicate": ("planner/cost/estimate.py", "_collectives"),
        "dp_shard": ("planner/cost/estimate.py", "_collectives"),
        "cp": ("planner/cost/estimate.py", "context_parallel_seconds"),
        "tp": ("planner/cost/estimate.py", "_UnitTimes._unit"),
    },
    "memory term": {
        "pp": ("planner/cost/estimate.py", "Estimator.pipeline_ranks"),  # each rank's stages, in flight
        "dp_replicate": "replicas hold exactly what their shard group holds: no memory term depends on it",
        "dp_shard": ("planner/cost/memory.py", "memory_moments"),
        "cp": ("planner/cost/memory.py", "memory_moments"),  # shards over dp_shard x cp; its share of tokens
        "tp": ("planner/cost/estimate.py", "Estimator.setting_for"),  # the rank's share of the model
    },
    "runtime apply step": {
        # The engines' data-parallel dims: contract.mesh.data_parallel_axes, cp folded in.
        "dp_replicate": ("executor/runtime/distributed.py", "data_parallel_dims"),
        "dp_shard": ("executor/runtime/distributed.py", "data_parallel_dims"),
        "pp": ("executor/runtime/parallelize.py", "parallelize_pipeline"),  # stages, then each parallelized
        "cp": ("executor/runtime/context_parallel.py", "apply_context_parallel"),
        "tp": ("executor/runtime/parallelize.py", "_tensor_parallel"),
    },
    "launcher": {
        # The world must be the mesh's product, and stages stay on whole nodes (header: _pipeline_header).
        "pp": ("executor/launch/render.py", "_pipeline_check"),
        "dp_replicate": ("contract/mesh.py", "Mesh.shown_axes"),
        "dp_shard": ("contract/mesh.py", "Mesh.shown_axes"),
        "cp": ("contract/mesh.py", "Mesh.shown_axes"),
        "tp": ("executor/launch/render.py", "_tensor_parallel_check"),
    },
    "dashboard": {
        "pp": ("api/dashboard/plan_views.py", "mesh_row"),  # and the Pipeline section (pipeline_views.py)
        "dp_replicate": ("api/dashboard/plan_views.py", "mesh_row"),
        "dp_shard": ("api/dashboard/plan_views.py", "mesh_row"),
        "cp": ("api/dashboard/plan_views.py", "mesh_row"),
        "tp": ("api/dashboard/plan_views.py", "mesh_row"),
    },
}


@cache
def _module(path: str) -> ast.Module:
    return ast.parse((REPO / path).read_text(encoding="utf-8"), filename=path)


def _function(path: str, qualname: str) -> ast.FunctionDef | None:
    scope: list[ast.stmt] = _module(path).body
    found: ast.AST | None = None
    for name in qualname.split("."):
        found = next(
            (n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None
        )
        if found is None:
            return None
        scope = found.body
    return found if isinstance(found, ast.FunctionDef) else None


def _reads(function: ast.FunctionDef, axis: str) -> bool:
    """Whether the function reads the axis: by attribute (`mesh.tp`), name, argument or string, or
    every axis at once through `MESH_AXES`."""
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and node.attr == axis:
            return True
        if isinstance(node, ast.Name) and node.id in (axis, "MESH_AXES", "AXES"):
            return True
        if isinstance(node, ast.arg) and node.arg == axis:
            return True
        if isinstance(node, ast.Constant) and node.value == axis:
            return True
        if isinstance(node, ast.keyword) and node.arg == axis:
            return True
    return False


def checklist_gaps(layers: dict[str, dict[str, Handler | str]], axes: tuple[str, ...]) -> list[str]:
    """What the checklist misses for `axes`: a layer without an entry for an axis, an entry for an
    axis the mesh no longer has, a handler that does not exist or never reads its axis."""
    gaps = []
    for layer, entries in layers.items():
        for axis in axes:
            if axis not in entries:
                gaps.append(f"{layer}: no entry for mesh axis {axis!r} (its function, or why not)")
        for axis, entry in entries.items():
            if axis not in axes:
                gaps.append(f"{layer}: entry for {axis!r}, which the mesh does not have")
            elif isinstance(entry, str):
                if len(entry.split()) < 4:
                    gaps.append(f"{layer}: {axis!r} does not apply, but the reason {entry!r} says nothing")
            elif (function := _function(*entry)) is None:
                gaps.append(f"{layer}: {entry[0]} has no function {entry[1]} (for {axis!r})")
            elif not _reads(function, axis):
                gaps.append(f"{layer}: {entry[0]} {entry[1]} never reads {axis!r}")
    return gaps


def test_the_mesh_axes_are_its_fields() -> None:
    assert tuple(f.name for f in dataclasses.fields(Mesh)) == MESH_AXES


def test_every_layer_handles_every_mesh_axis() -> None:
    assert checklist_gaps(LAYERS, MESH_AXES) == []


def test_a_new_axis_fails_until_every_layer_has_its_place() -> None:
    gaps = checklist_gaps(LAYERS, (*MESH_AXES, "ep"))
    assert len(gaps) == len(LAYERS) and all("'ep'" in gap for gap in gaps)


def test_a_handler_that_ignores_its_axis_is_caught() -> None:
    search = {**LAYERS["search axis"], "tp": ("planner/enumeration.py", "data_parallel_meshes")}
    wrong: dict[str, dict[str, Handler | str]] = {"search axis": search}
    assert checklist_gaps(wrong, MESH_AXES) == []  # it reads tp (world / tp): a fair entry
    wrong["search axis"]["tp"] = ("planner/enumeration.py", "hybrid_shard_sizes_missing")
    wrong["search axis"]["dp_shard"] = ("contract/mesh.py", "Mesh.shard_link")
    wrong["search axis"]["dp_replicate"] = ("contract/mesh.py", "Mesh.shard_link")
    gaps = checklist_gaps(wrong, MESH_AXES)
    assert any("has no function hybrid_shard_sizes_missing" in gap for gap in gaps)
    assert any("Mesh.shard_link never reads 'dp_replicate'" in gap for gap in gaps)
