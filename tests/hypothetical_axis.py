"""What every layer that only names mesh axes does with an axis that is nothing but a registry entry.

tests/test_mesh_layers.py copies the packages, adds one `Axis` (a hypothetical one, `hx`) to the copy's
contract/mesh.py and its degree to `Mesh`, and runs this file against the copy: nothing else in the copy
changes. It prints, as JSON, what each layer shows for the new axis; the test checks it.
"""

from __future__ import annotations

import inspect
import json
import sys
from types import SimpleNamespace
from typing import Any

from typer.testing import CliRunner

DEBUG_PLAN = [
    "plan",
    "--model",
    "llama-debug",
    "--cluster",
    "1x2xcpu",
    "--seq-len",
    "64",
    "--global-batch-tokens",
    "512",
    "--precision",
    "fp32",
]
WIDE = {"COLUMNS": "300"}


def probe() -> dict[str, Any]:
    from api.cli.common import in_cli_terms
    from api.cli.main import app
    from api.cli.plan_cmd import search_pins
    from api.dashboard import plan_form, plan_views, study_form
    from api.routers import plans as plans_router
    from api.services.plan_compare import FIELDS
    from api.services.plan_listing import PlanFilters
    from contract import mesh
    from executor.launch.render import LaunchContext, launch_sh
    from planner.catalog.models import resolve_model
    from planner.specs import SearchSpace, TrainingSpec
    from planner.study import StudyRequest

    found: dict[str, Any] = {"contract": mesh.__file__, "axes": list(mesh.MESH_AXES)}
    hx = mesh.Mesh(dp_shard=2, hx=2, tp=2)
    found["mesh"] = {
        "label": hx.label(),
        "describe": hx.describe(),
        "world_size": hx.world_size,
        "splits": hx.splits(),
        "document": hx.as_document(),
        "read": mesh.Mesh.from_document({"hx": 4, "dp_shard": 2}).hx,
        "hashed_as_before": "hx" in mesh.ADDED_MESH_AXES,
        "optional": "hx" in mesh.OPTIONAL_AXES,
        "problems": mesh.mesh_problems(
            hx, resolve_model("llama-debug"), TrainingSpec(seq_len=64, global_batch_tokens=512)
        ),
    }
    runner = CliRunner()
    plan_help = runner.invoke(app, ["plan", "--help"], env=WIDE).output
    whatif_help = runner.invoke(app, ["whatif", "--help"], env=WIDE).output
    bad = runner.invoke(app, [*DEBUG_PLAN, "--hx", "x"], env=WIDE)
    found["cli"] = {
        "plan_option": "--hx" in plan_help and "Pin the hypothetical-parallel degrees" in plan_help,
        "whatif_option": "--hx" in whatif_help,
        "pins": search_pins(axis_pins={"hx": ["4,2", "2"]}).hypothetical_parallel_degrees,
        "bad_pin": (bad.exit_code, bad.stderr.strip()),
        "in_cli_terms": in_cli_terms("search.hypothetical_parallel_degrees: hx=3 does not fit"),
    }
    schema = SearchSpace.model_json_schema()["properties"]
    found["api"] = {
        "search_field": "hypothetical_parallel_degrees" in schema,
        "pinned": SearchSpace.model_validate(
            {"hypothetical_parallel_degrees": [4, 2]}
        ).hypothetical_parallel_degrees,
        "unset_omitted": "hypothetical_parallel_degrees" not in SearchSpace().model_dump(),
        "list_filter": PlanFilters(hx=2).mesh,
        "list_query": "hx" in inspect.signature(plans_router._mesh_filters).parameters,
    }
    study = StudyRequest.model_validate(
        {
            "model": resolve_model("llama-debug"),
            "token_budget": 10**9,
            "gpus": [{"gpu": "cpu"}],
            "cluster_sizes": [2],
            "seq_len": 64,
            "global_batch_tokens": 512,
            "search": search_pins(axis_pins={"hx": ["2"]}).model_dump(mode="json"),
        }
    )
    study_pins = study_form.StudyForm(pins={"hypothetical_parallel_degree": "2"})
    study_form_body = study_form.to_study_create(study_pins)
    found["study_pins"] = {
        "whatif": study.search.hypothetical_parallel_degrees,
        "dashboard": study_form_body.search.hypothetical_parallel_degrees if study_form_body else None,
    }
    script = launch_sh(
        LaunchContext(
            title="t",
            plan_hash="0" * 64,
            short_hash="0" * 12,
            job_name="j",
            k8s_name="k",
            num_nodes=1,
            gpus_per_node=8,
            gpu="H100",
            uses_gpus=True,
            image="i",
            label="l",
            mesh=hx,
        )
    )
    found["bundle"] = {
        "header": "dp_replicate 1 x dp_shard 2 x hx 2 x tp 2 = 8 ranks" in script,
        "node_check": '"$((NPROC_PER_NODE % 2))"' in script and "each hx group is 2 consecutive" in script,
        "replan": "re-plan with --hx" in script,
    }
    compared = [f for f in FIELDS if f.key == "config.mesh.hx"]
    form = plan_form.PlanForm(pins={"hypothetical_parallel_degree": "2"})
    body = plan_form.to_plan_create(form)
    found["dashboard"] = {
        "mesh_row": plan_views.mesh_row(SimpleNamespace(mesh=hx)).value,  # type: ignore[arg-type]
        "mesh_note": plan_views.mesh_row(SimpleNamespace(mesh=hx)).hint,  # type: ignore[arg-type]
        "compare_row": compared[0].label if compared else None,
        "compare_value": plan_views._compare_value("config.mesh.hx", 2),
        "form_fields": [pin.name for pin in form.pin_fields],
        "form_pins": body.search.hypothetical_parallel_degrees if body and body.search else form.errors,
    }
    found["unmigrated"] = unmigrated()
    return found


def unmigrated() -> list[str]:
    """The model's indexes on plans that a database migrated to head lacks: the one thing storage
    needs by hand for an axis, a migration adding its list-filter index (0011 did it for ep). (Names
    are compared: SQLite cannot reflect an expression index for `alembic check` to compare.)"""
    import tempfile

    import sqlalchemy as sa

    from api.db import migrate, models
    from api.db.session import create_db_engine

    with tempfile.TemporaryDirectory() as folder:
        engine = create_db_engine(f"sqlite:///{folder}/plans.db")
        try:
            migrate.upgrade(engine)
            with engine.connect() as connection:
                made = set(connection.execute(sa.text(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'plans'"
                )).scalars())
        finally:
            engine.dispose()
    return sorted(str(index.name) for index in models.PlanRow.__table__.indexes if index.name not in made)


if __name__ == "__main__":
    json.dump(probe(), sys.stdout, default=list)
