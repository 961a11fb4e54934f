"""What every layer that only names mesh axes does with an axis that is nothing but a registry entry.

tests/test_mesh_layers.py copies the packages, adds one `Axis` (expert parallelism, `ep`) to the copy's
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
    ep = mesh.Mesh(dp_shard=2, ep=2, tp=2)
    found["mesh"] = {
        "label": ep.label(),
        "describe": ep.describe(),
        "world_size": ep.world_size,
        "splits": ep.splits(),
        "document": ep.as_document(),
        "read": mesh.Mesh.from_document({"ep": 4, "dp_shard": 2}).ep,
        "hashed_as_before": "ep" in mesh.ADDED_MESH_AXES,
        "optional": "ep" in mesh.OPTIONAL_AXES,
        "problems": mesh.mesh_problems(
            ep, resolve_model("llama-debug"), TrainingSpec(seq_len=64, global_batch_tokens=512)
        ),
    }
    runner = CliRunner()
    plan_help = runner.invoke(app, ["plan", "--help"], env=WIDE).output
    whatif_help = runner.invoke(app, ["whatif", "--help"], env=WIDE).output
    bad = runner.invoke(app, [*DEBUG_PLAN, "--ep", "x"], env=WIDE)
    found["cli"] = {
        "plan_option": "--ep" in plan_help and "Pin the expert-parallel degrees" in plan_help,
        "whatif_option": "--ep" in whatif_help,
        "pins": search_pins(axis_pins={"ep": ["4,2", "2"]}).expert_parallel_degrees,
        "bad_pin": (bad.exit_code, bad.stderr.strip()),
        "in_cli_terms": in_cli_terms("search.expert_parallel_degrees: ep=3 does not fit"),
    }
    schema = SearchSpace.model_json_schema()["properties"]
    found["api"] = {
        "search_field": "expert_parallel_degrees" in schema,
        "pinned": SearchSpace.model_validate({"expert_parallel_degrees": [4, 2]}).expert_parallel_degrees,
        "unset_omitted": "expert_parallel_degrees" not in SearchSpace().model_dump(),
        "list_filter": PlanFilters(ep=2).mesh,
        "list_query": "ep" in inspect.signature(plans_router._mesh_filters).parameters,
    }
    study = StudyRequest.model_validate(
        {
            "model": resolve_model("llama-debug"),
            "token_budget": 10**9,
            "gpus": [{"gpu": "cpu"}],
            "cluster_sizes": [2],
            "seq_len": 64,
            "global_batch_tokens": 512,
            "search": search_pins(axis_pins={"ep": ["2"]}).model_dump(mode="json"),
        }
    )
    study_form_body = study_form.to_study_create(study_form.StudyForm(pins={"expert_parallel_degree": "2"}))
    found["study_pins"] = {
        "whatif": study.search.expert_parallel_degrees,
        "dashboard": study_form_body.search.expert_parallel_degrees if study_form_body else None,
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
            mesh=ep,
        )
    )
    found["bundle"] = {
        "header": "dp_replicate 1 x dp_shard 2 x ep 2 x tp 2 = 8 ranks" in script,
        "node_check": '"$((NPROC_PER_NODE % 2))"' in script and "each ep group is 2 consecutive" in script,
        "replan": "re-plan with --ep" in script,
    }
    compared = [f for f in FIELDS if f.key == "config.mesh.ep"]
    form = plan_form.PlanForm(pins={"expert_parallel_degree": "2"})
    body = plan_form.to_plan_create(form)
    found["dashboard"] = {
        "mesh_row": plan_views.mesh_row(SimpleNamespace(mesh=ep)).value,  # type: ignore[arg-type]
        "mesh_note": plan_views.mesh_row(SimpleNamespace(mesh=ep)).hint,  # type: ignore[arg-type]
        "compare_row": compared[0].label if compared else None,
        "compare_value": plan_views._compare_value("config.mesh.ep", 2),
        "form_fields": [pin.name for pin in form.pin_fields],
        "form_pins": body.search.expert_parallel_degrees if body and body.search else form.errors,
    }
    return found


if __name__ == "__main__":
    json.dump(probe(), sys.stdout, default=list)
