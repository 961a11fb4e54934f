"""A pure-bf16 plan's bundle says so in every launcher's header, and its label names a first-n-blocks
checkpointing; mixed-precision bundles are as before."""

from __future__ import annotations

from executor.launch.bundle import bundle_files
from planner.plan import Plan
from tests.executor.launch_lint import lint_script
from tests.executor.plan_factory import debug_plan


def test_a_pure_bf16_bundle_states_it_and_its_checkpointed_blocks(tmp_path) -> None:
    doc = debug_plan(precision="bf16", gpus_per_node=8)
    doc["training"]["state_dtype"] = "bfloat16"
    doc["config"]["reduce_dtype"] = "bfloat16"
    doc["config"]["checkpointing"] = {"mode": "blocks", "every_k": 1, "blocks": 1}
    doc["cluster"]["gpu"] = "h100-sxm"
    files = {f.path: f.data.decode() for f in bundle_files(Plan.model_validate(doc))}
    for name in ("launch.sh", "slurm.sbatch", "k8s.yaml"):
        assert "# precision: pure bf16 (training.state_dtype bfloat16)" in files[name], name
        assert "AC=first1" in files[name], name
    plain = {f.path: f.data.decode() for f in bundle_files(Plan.model_validate(debug_plan(precision="bf16")))}
    assert "pure bf16" not in plain["launch.sh"]
    script = tmp_path / "launch.sh"
    script.write_text(files["launch.sh"])
    lint_script(script)  # last: without shellcheck it skips
