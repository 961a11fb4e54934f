"""A rack-scale plan (GB200 NVL72: nodes of 4 in a 72-GPU NVLink domain) may split tensor parallelism
over several nodes: the plan document states its domain, the runtime's plan check takes it, and the
launch script tiles groups over nodes instead of refusing them."""

from __future__ import annotations

import subprocess

from contract.plan_document import parse_plan
from executor.launch.bundle import bundle_files
from planner.search import make_plan
from planner.specs import SearchSpace
from tests.planner.conftest import make_request


def _rack_plan():
    request = make_request("llama3-8b", "4x72xGB200", seq_len=4096, sequences=288,
                           search=SearchSpace(tensor_parallel_degrees=[8]))
    return make_plan(request)


def test_the_document_states_the_domain_and_the_runtime_checks_against_it() -> None:
    plan = _rack_plan()
    assert plan.config.mesh.tp == 8 and plan.cluster.gpus_per_node == 4
    document = plan.model_dump(mode="json")
    assert document["cluster"]["scaleup_domain_gpus"] == 72
    assert parse_plan(document).cluster.domain_gpus == 72  # tp 8 over two nodes: accepted


def test_an_h100_plan_states_no_domain() -> None:
    plan = make_plan(make_request("llama3-8b", "2x8xH100", seq_len=4096, sequences=16))
    assert "scaleup_domain_gpus" not in plan.model_dump(mode="json")["cluster"]


def test_the_launch_script_tiles_tp_groups_over_nodes_of_a_domain() -> None:
    files = {f.path: f.data.decode() for f in bundle_files(_rack_plan(), target="torchrun")}
    script = files["launch.sh"]
    start = script.index("# The plan's tensor-parallel groups")
    check = script[start:script.index("fi\n", start) + 3]
    assert "NVLink domain of 72" in check
    for nproc, refused in ((4, False), (8, False), (2, False), (3, True), (6, True)):
        result = subprocess.run(
            ["bash", "-c", f"NPROC_PER_NODE={nproc}\n{check}"], capture_output=True, text=True
        )
        assert (result.returncode == 2) == refused, (nproc, result.stderr)


def test_a_domain_of_its_own_is_written_once() -> None:
    plan = make_plan(make_request("llama3-8b", "2x36xGB200", seq_len=4096, sequences=72))
    assert plan.model_dump(mode="json")["cluster"]["scaleup_domain_gpus"] == 36


def test_the_bundles_words_say_the_tp_groups_stay_inside_the_domain_not_a_node() -> None:
    # 4x72xGB200 at tp 8: groups of 8 over two nodes of 4, inside one 72-GPU NVLink domain.
    files = {f.path: f.data.decode() for f in bundle_files(_rack_plan(), target="all")}
    readme = files["README.md"]
    assert "consecutive ranks inside one NVLink domain of 72 GPUs, across nodes**" in readme
    assert "inside one node" not in readme and "multiple of 8 or a whole share of one" in readme
    for name in ("launch.sh", "slurm.sbatch"):
        header = files[name][:files[name].index("\n\n")]
        assert "tp groups are 8 consecutive ranks inside one NVLink domain of 72 GPUs, across nodes" in header
        assert "inside a node" not in header and "Every node runs a multiple of 8" not in header
    # An H100 plan's groups stay inside one node, as before.
    h100 = make_plan(make_request("llama3-8b", "2x8xH100", seq_len=4096, sequences=16,
                                  search=SearchSpace(tensor_parallel_degrees=[4])))
    words = {f.path: f.data.decode() for f in bundle_files(h100, target="all")}
    assert "consecutive ranks inside one node**" in words["README.md"]
    assert "tp groups are 4 consecutive ranks inside one node" in words["launch.sh"]
    assert "Every node runs a multiple of 4." in words["launch.sh"]
