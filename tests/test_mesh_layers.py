"""A parallel dimension is one registry entry plus its physics: the promise of contract/mesh.py, tested.

The mesh's axes are one table (`contract.mesh.AXES`). Every layer that only *names* axes (CLI pins,
API search fields and list filters, labels and descriptions, compare, the dashboard's mesh row and plan
form, the what-if study's pins, storage as one document, the launcher's checks) iterates it; an axis
writes code only where it has physics. That code is the checklist `PHYSICS`: per axis, the one function
that applies it in each such layer (the source is parsed, nothing imported: the runtime's files need
torch). docs/architecture.md's "Adding a parallel dimension" is this file in prose.

`test_a_new_axis_is_one_entry_everywhere_else` proves the rest: it copies the packages, adds a made-up
`hx` entry to the copy's registry (and its degree to `Mesh`), changes nothing else, and checks what
every naming layer shows for it (tests/hypothetical_axis.py), and that storage lacks only the
migration adding its list-filter index. `test_no_layer_writes_its_own_axis_list` keeps it true: no
tuple or list of axis names, no `--tp` literal, outside the registry; `test_no_layer_combines_axes_by_hand`
likewise for formulas over several degrees (`pp * tp * cp`, `mesh.tp == 1 and mesh.pp == 1`), which
`Mesh`'s properties name once.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from contract.mesh import (
    ADDED_MESH_AXES,
    AXES,
    MESH_AXES,
    MODEL_PARALLEL_AXES,
    OPTIONAL_AXES,
    SEQUENCE_AXES,
    SHARD_AXES,
    WORLD_AXES,
    Mesh,
    exposed_comm_axes,
)

REPO = Path(__file__).resolve().parents[1]

Handler = tuple[str, str]
"""(file relative to the repository, function or `Class.method` there) that applies an axis."""

PHYSICS: dict[str, dict[str, Handler | str]] = {
    "search degrees": {  # which degrees the search tries unpinned (a pin is the registry's)
        "pp": ("planner/enumeration.py", "pipeline_parallel_degrees"),
        "dp_replicate": ("planner/enumeration.py", "data_parallel_meshes"),
        "dp_shard": ("planner/enumeration.py", "data_parallel_meshes"),
        "cp": ("planner/enumeration.py", "context_parallel_degrees"),
        "tp": ("planner/enumeration.py", "tensor_parallel_degrees"),
        "ep": ("planner/enumeration.py", "expert_parallel_degrees"),
    },
    "cost term": {
        "pp": ("planner/cost/estimate.py", "Estimator._pipeline_timing"),  # the bubble and the sends
        "dp_replicate": ("planner/cost/estimate.py", "_collectives"),
        "dp_shard": ("planner/cost/estimate.py", "_collectives"),
        "cp": ("planner/cost/estimate.py", "context_parallel_seconds"),
        "tp": ("planner/cost/estimate.py", "_UnitTimes._unit"),
        "ep": ("planner/cost/estimate.py", "expert_parallel_seconds"),  # dispatch and combine all-to-alls
    },
    "memory term": {
        "pp": ("planner/cost/estimate.py", "Estimator.pipeline_ranks"),  # each rank's stages, in flight
        "dp_replicate": "replicas hold exactly what their shard group holds: no memory term depends on it",
        "dp_shard": ("planner/cost/memory.py", "memory_moments"),
        "cp": ("planner/cost/memory.py", "memory_moments"),  # shards over dp_shard x cp; its share of tokens
        "tp": ("planner/cost/estimate.py", "Estimator.setting_for"),  # the rank's share of the model
        "ep": ("planner/cost/memory.py", "sharded_states"),  # E/ep experts over (dp_shard x cp)/ep shards
    },
    "runtime apply step": {
        # The engines' data-parallel dims: contract.mesh.data_parallel_axes, cp folded in.
        "dp_replicate": ("executor/runtime/distributed.py", "data_parallel_dims"),
        "dp_shard": ("executor/runtime/distributed.py", "data_parallel_dims"),
        "pp": ("executor/runtime/parallelize.py", "parallelize_pipeline"),  # stages, then each parallelized
        "cp": ("executor/runtime/context_parallel.py", "apply_context_parallel"),
        "tp": ("executor/runtime/parallelize.py", "_tensor_parallel"),
        "ep": ("executor/runtime/parallelize.py", "_expert_parallel"),  # experts split, all-to-all dispatch
    },
}
"""Where each axis has physics: the only code an axis needs beside its registry entry."""

DERIVED: dict[str, tuple[str, ...]] = {
    "fsdp_shards": SHARD_AXES,
    "sequence_pieces": SEQUENCE_AXES,
    "sequence_ranks": SEQUENCE_AXES,
    "dp": tuple(axis for axis in MESH_AXES if axis not in MODEL_PARALLEL_AXES),
    "model_parallel": MODEL_PARALLEL_AXES,
    "expert_shards": ("ep", *SHARD_AXES),
    "expert_span": ("ep", "tp"),
    "world_size": WORLD_AXES,
    "shape": WORLD_AXES,
}
"""`Mesh` properties that read several axes from the registry: reading one reads each of them."""


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
    """Whether the function reads the axis: by attribute (`mesh.tp`), name, argument or string, through
    a property that reads it (`mesh.fsdp_shards`), or every axis at once through the registry."""
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and (node.attr == axis or axis in DERIVED.get(node.attr, ())):
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


def test_the_mesh_is_the_registry() -> None:
    assert tuple(f.name for f in dataclasses.fields(Mesh)) == MESH_AXES == tuple(a.name for a in AXES)
    assert OPTIONAL_AXES == ADDED_MESH_AXES == ("pp", "ep", "cp") and SHARD_AXES == ("dp_shard", "cp")
    assert MODEL_PARALLEL_AXES == ("pp", "cp", "tp") and SEQUENCE_AXES == ("cp", "tp")
    assert WORLD_AXES == ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # ep is carved out of dp_shard x cp
    mesh = Mesh(pp=4, dp_replicate=2, dp_shard=2, cp=2, tp=4)
    assert mesh.label() == "pp4 dp2x2 cp2 tp4" and Mesh(dp_shard=8).label() == "dp8x1 tp1"
    assert mesh.describe() == "pp 4 x dp_replicate 2 x dp_shard 2 x cp 2 x tp 4 = 128 ranks"
    assert Mesh(dp_replicate=2, dp_shard=4).describe() == "dp_replicate 2 x dp_shard 4 x tp 1 = 8 ranks"
    assert (mesh.world_size, mesh.dp, mesh.fsdp_shards, mesh.model_parallel, mesh.stage_ranks) == (
        128,
        4,
        4,
        32,
        32,
    )
    # The sequence: 2 x cp load-balanced chunks, each split over the tp ranks; tp alone splits it tp ways.
    assert (mesh.sequence_pieces, Mesh(tp=2).sequence_pieces, Mesh(cp=3).sequence_pieces) == (16, 2, 6)
    assert mesh.splits() == [
        "blocks in 4 pipeline stages",
        "sequences split over 2 ranks",
        "sequence + loss parallel",
    ]
    # Expert parallelism is carved out of the shard group: not a factor of the world, nor a DeviceMesh dim.
    experts = Mesh(dp_shard=32, ep=8, tp=8)
    assert (experts.world_size, experts.shape, experts.expert_shards) == (256, (1, 1, 32, 1, 8), 4)
    assert experts.label() == "dp32x1 ep8 tp8"
    assert experts.describe() == "dp_replicate 1 x dp_shard 32 (ep 8) x tp 8 = 256 ranks"
    carved = Mesh(dp_shard=4, cp=2, ep=8)
    assert carved.describe() == "dp_replicate 1 x dp_shard 4 x cp 2 (ep 8) x tp 1 = 8 ranks"


def test_each_exposed_communication_is_a_prediction_field() -> None:
    from planner.plan import Prediction

    assert [entry.name for entry in exposed_comm_axes()] == ["tp", "ep"]  # the rows' order
    for entry in exposed_comm_axes():
        assert Prediction.model_fields[entry.exposed_comm].annotation is float, entry.name
        assert entry.exposed_comm_why and "{degree}" in entry.exposed_comm_detail, entry.name


def test_every_axis_has_its_physics() -> None:
    assert checklist_gaps(PHYSICS, MESH_AXES) == []


def test_a_new_axis_needs_exactly_its_physics() -> None:
    gaps = checklist_gaps(PHYSICS, (*MESH_AXES, "hx"))
    assert len(gaps) == len(PHYSICS) and all("'hx'" in gap for gap in gaps)
    assert {gap.split(":")[0] for gap in gaps} == {
        "search degrees",
        "cost term",
        "memory term",
        "runtime apply step",
    }


def test_a_handler_that_ignores_its_axis_is_caught() -> None:
    search = {**PHYSICS["search degrees"], "tp": ("planner/enumeration.py", "data_parallel_meshes")}
    wrong: dict[str, dict[str, Handler | str]] = {"search degrees": search}
    assert checklist_gaps(wrong, MESH_AXES) == []  # it reads tp (world / tp): a fair entry
    wrong["search degrees"]["tp"] = ("planner/enumeration.py", "hybrid_shard_sizes_missing")
    wrong["search degrees"]["dp_shard"] = ("contract/mesh.py", "Mesh.expert_shards")
    wrong["search degrees"]["dp_replicate"] = ("contract/mesh.py", "Mesh.expert_shards")
    gaps = checklist_gaps(wrong, MESH_AXES)
    assert any("has no function hybrid_shard_sizes_missing" in gap for gap in gaps)
    assert any("Mesh.expert_shards never reads 'dp_replicate'" in gap for gap in gaps)
    assert not any("Mesh.expert_shards never reads 'dp_shard'" in gap for gap in gaps)  # via fsdp_shards


NEW_AXIS = """    Axis(
        name="hx",
        what="hypothetical-parallel",
        doc="Expert-parallel degree: ranks each holding some of every MoE block's experts.",
        search_field="hypothetical_parallel_degrees",
        search_doc="Hypothetical-parallel degrees to consider (`[8]` pins hx=8).",
        cli_help="Pin the hypothetical-parallel degrees to search (repeatable or comma-separated).",
        form_help="Empty: the planner searches it. A number pins it.",
        label="hx",
        optional=True,
        added_after_schema_2=True,
        shards="experts over {degree} ranks",
        note="each rank holds 1/{degree} of the experts, tokens sent to theirs and back (all-to-all)",
        compare_label="Hypothetical parallel (GPUs)",
        compare_shown="{degree} (experts split)",
        divides=(Size(name="gpus_per_node", of="cluster"),),
        divides_reason="an expert group exchanges its tokens inside a node",
    ),
"""
"""The one entry a hypothetical axis costs in the registry (placed before cp, multiplying the world)."""
NEW_DEGREE = '''    hx: int = 1
    """Hypothetical-parallel degree (`AXES`: hx)."""
'''


def _copy_with_new_axis(root: Path) -> None:
    """The packages, with `NEW_AXIS` in the registry and its degree on `Mesh`: nothing else changed."""
    for package in ("contract", "planner", "api", "executor", "migrations"):
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    source = (root / "contract/mesh.py").read_text(encoding="utf-8")
    entry, degree = '    Axis(\n        name="cp",\n', "    cp: int = 1\n"
    assert source.count(entry) == 1 and source.count(degree) == 1
    source = source.replace(entry, NEW_AXIS + entry).replace(degree, NEW_DEGREE + degree)
    (root / "contract/mesh.py").write_text(source, encoding="utf-8")


def test_a_new_axis_is_one_entry_everywhere_else(tmp_path: Path) -> None:
    _copy_with_new_axis(tmp_path)
    # Run from the copy (a script's folder comes first on sys.path: tests/ would shadow the packages).
    shutil.copy(REPO / "tests/hypothetical_axis.py", tmp_path / "hypothetical_axis.py")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "hypothetical_axis.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["contract"].startswith(str(tmp_path))  # the copy ran, not the checkout
    assert found["axes"] == ["pp", "dp_replicate", "dp_shard", "ep", "hx", "cp", "tp"]
    # Label, description, world size, storage as one document (old plans hash as before: degree 1 is
    # what its absence meant), the validity rules (it has none: nothing to divide).
    assert found["mesh"] == {
        "label": "dp2x1 hx2 tp2",
        "describe": "dp_replicate 1 x dp_shard 2 x hx 2 x tp 2 = 8 ranks",
        "world_size": 8,
        "splits": ["experts over 2 ranks", "sequence + loss parallel"],
        "document": {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "ep": 1, "hx": 2, "cp": 1, "tp": 2},
        "read": 4,
        "hashed_as_before": True,
        "optional": True,
        "problems": [],
    }
    # The command line: --hx on plan and whatif with its help, read into the search space, a bad value
    # refused naming the option, the planner's messages in the option's terms.
    assert found["cli"] == {
        "plan_option": True,
        "whatif_option": True,
        "pins": [2, 4],
        "bad_pin": [
            2,
            "error: --hx: 'x' is not a hypothetical-parallel degree; give whole numbers from 1 to "
            "1024 (GPUs of one scale-up domain: its groups stay inside one), e.g. --hx 8 or --hx 2,4 (leave "
            "--hx out to search every degree)",
        ],
        "in_cli_terms": "--hx: hx=3 does not fit",
    }
    # The API: the search field, kept in order, omitted when unset (requests hash as before); the list
    # filter and its query parameter (`?hx=2`); the what-if study's pins.
    assert found["api"] == {
        "search_field": True,
        "pinned": [2, 4],
        "unset_omitted": True,
        "list_filter": [["hx", 2]],
        "list_query": True,
    }
    assert found["study_pins"] == {"whatif": [2], "dashboard": [2]}  # whatif --hx, the study form's field
    # The bundle: launch.sh states the mesh, and refuses a node whose process count splits an hx group
    # (its groups stay inside a node: it divides the GPUs per node), naming the option to re-plan with.
    assert found["bundle"] == {"header": True, "node_check": True, "replan": True}
    # The dashboard: the mesh row and its note, the compare row, the plan form's pin.
    assert found["dashboard"] == {
        "mesh_row": "dp_replicate 1 × dp_shard 2 × hx 2 × tp 2",
        "mesh_note": "8 GPUs; each rank holds 1/2 of the experts, tokens sent to theirs and back "
        "(all-to-all); each tp group is 2 consecutive ranks inside a scale-up domain (a node, or an NVLink "
        "rack), with sequence parallel and loss parallel (vocabulary-sharded cross-entropy)",
        "compare_row": "Hypothetical parallel (GPUs)",
        "compare_value": "2 (experts split)",
        "form_fields": [
            "tensor_parallel_degree",
            "context_parallel_degree",
            "hypothetical_parallel_degree",
            "expert_parallel_degree",
            "pipeline_parallel_degree",
        ],
        "form_pins": [2],
    }
    # Storage: the mesh is one JSON document (no column), but the list filter's expression index is
    # made by a migration: the models name ix_plans_mesh_hx, the migrations at head have none.
    assert found["unmigrated"] == ["ix_plans_mesh_hx"]


NAMING_LAYERS = ("api", "planner", "executor/launch")
"""Where axes are only named: no hand-written list of them belongs there."""


def axis_lists(path: Path) -> list[str]:
    """Hand-written axis lists in a module: a tuple, list or set of two axis names or more, a dict
    keyed by two or more, or an axis's command-line option as a literal (`"--tp"`)."""
    names = set(MESH_AXES)
    options = {axis.option for axis in AXES if axis.option}
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            listed = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
        elif isinstance(node, ast.Dict):
            listed = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
        elif isinstance(node, ast.Constant) and node.value in options:
            found.append(f"{shown}:{node.lineno}: {node.value!r}")
            continue
        else:
            continue
        if len(listed) >= 2:
            found.append(f"{shown}:{node.lineno}: {', '.join(listed)}")
    return found


def test_no_layer_writes_its_own_axis_list() -> None:
    found = [
        hit
        for layer in NAMING_LAYERS
        for path in sorted((REPO / layer).rglob("*.py"))
        for hit in axis_lists(path)
    ]
    assert found == [], "iterate contract.mesh.AXES (or a tuple derived there) instead:\n" + "\n".join(found)


PHYSICS_LAYERS = ("planner/cost",)
"""Where axes have physics (the cost and memory terms of `PHYSICS`): there a formula over several
degrees is the model itself (a rank's share of the model at tp x cp x ep, the span of an ep x tp
group), so `axis_arithmetic` does not scan it."""
ARITHMETIC_PENDING: dict[str, str] = {}
"""Files `axis_arithmetic` skips for now, each with why: an entry is debt, to be removed."""


def _axis_read(node: ast.AST) -> str | None:
    """The axis an expression reads directly: `mesh.tp`, `c.mesh.cp`, or a variable named `pp`."""
    if isinstance(node, ast.Attribute) and node.attr in MESH_AXES:
        return node.attr
    if isinstance(node, ast.Name) and node.id in MESH_AXES:
        return node.id
    return None


def _operands(node: ast.expr) -> list[ast.expr]:
    """The leaves of a chain of arithmetic (`pp * tp * cp` -> pp, tp, cp) or of a comparison."""
    if isinstance(node, ast.BinOp):
        return [*_operands(node.left), *_operands(node.right)]
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    return [node]


def axis_arithmetic(path: Path) -> list[str]:
    """Expressions combining two or more axes' degrees by hand: arithmetic (`pp * tp * cp`,
    `dp_replicate * dp_shard`), a condition (`mesh.tp == 1 and mesh.pp == 1`), a tuple or list
    (`for pp, tp, cp in ...`, `(c.mesh.pp, c.mesh.tp)`), or a call's arguments (`max(mesh.pp,
    mesh.tp)`). `Mesh` names each such product once (model_parallel, dp, fsdp_shards,
    sequence_ranks, sequence_pieces) and `MODEL_PARALLEL_AXES` and the like iterate the rest."""
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    inside_arithmetic = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        for child in (node.left, node.right)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and id(node) not in inside_arithmetic:
            parts = _operands(node)
        elif isinstance(node, ast.BoolOp):
            parts = [leaf for value in node.values for leaf in _operands(value)]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            parts = node.elts
        elif isinstance(node, ast.Call):
            parts = node.args
        else:
            continue
        axes = sorted({name for part in parts if (name := _axis_read(part))})
        if len(axes) >= 2:
            found.append(f"{shown}:{node.lineno}: {', '.join(axes)}: {ast.unparse(node)[:80]}")
    return found


def test_no_layer_combines_axes_by_hand() -> None:
    pending = [REPO / path for path in ARITHMETIC_PENDING]
    assert all(path.exists() for path in pending), "drop ARITHMETIC_PENDING's entries for removed files"
    found = [
        hit
        for layer in NAMING_LAYERS
        for path in sorted((REPO / layer).rglob("*.py"))
        if path not in pending and not any(path.is_relative_to(REPO / p) for p in PHYSICS_LAYERS)
        for hit in axis_arithmetic(path)
    ]
    assert found == [], "read the Mesh property (or iterate a tuple of contract.mesh) instead:\n" + "\n".join(
        found
    )
    # A pending file that no longer combines axes by hand leaves the list.
    assert [path for path in pending if not axis_arithmetic(path)] == []


@pytest.mark.parametrize(
    "source",
    [
        "ranks = pp * tp * cp",
        "dp = world // (pp * tp * cp)",
        "dp = config.mesh.dp_replicate * config.mesh.dp_shard",
        "only = mesh.tp == 1 and mesh.pp == 1 and mesh.cp == 1",
        "if max(mesh.pp, mesh.cp, mesh.tp) == 1: pass",
        "key = (c.mesh.pp, c.pipeline, c.mesh.tp)",
        "for pp, tp, cp in meshes: pass",
        "meshes(request, tp, cp, pp)",
        "sizes(dp, node, tp=tp * cp)",
    ],
)
def test_the_scan_finds_each_kind_of_arithmetic(tmp_path: Path, source: str) -> None:
    module = tmp_path / "layer.py"
    module.write_text(source + "\n", encoding="utf-8")
    assert axis_arithmetic(module), source


@pytest.mark.parametrize(
    "source",
    [
        "ranks = mesh.model_parallel * mesh.tp",  # one axis, beside a property
        "span = mesh.tp * other.tp",  # the same axis of two meshes
        "mesh = Mesh(pp=pp, cp=cp, tp=tp)",  # keywords name each axis once
        "share = vocab // parallel.tp",
    ],
)
def test_the_scan_passes_single_axis_reads(tmp_path: Path, source: str) -> None:
    module = tmp_path / "layer.py"
    module.write_text(source + "\n", encoding="utf-8")
    assert axis_arithmetic(module) == [], source


@pytest.mark.parametrize(
    "source",
    [
        'SPLIT = ("pp", "cp")',
        'options = ["--tp"]',
        'pins = {"tp": 1, "pp": 2}',
        'x = {"cp", "tp", "other"}',
    ],
)
def test_the_scan_finds_each_kind_of_list(tmp_path: Path, source: str) -> None:
    module = tmp_path / "layer.py"
    module.write_text(source + "\n", encoding="utf-8")
    assert axis_lists(module), source
