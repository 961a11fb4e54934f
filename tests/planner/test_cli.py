"""`fsdp-planner plan` end to end through the console entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from contract.plan_document import SCHEMA_VERSION
from planner.formatting import duration
from tests.planner.test_specs import HF_LLAMA3

runner = CliRunner()


def test_plan_catalog_model_prints_a_table() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "8192",
            "--global-batch-tokens",
            str(8192 * 16),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Chosen:" in result.output and "tokens/s/GPU" in result.output
    assert "Why the other families lost" in result.output


def test_plan_json_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "gpt2",
            "--cluster",
            "1x2xcpu",
            "--seq-len",
            "256",
            "--global-batch-tokens",
            "2048",
            "--json",
            "-o",
            str(out),
            "--top",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads(out.read_text())
    assert printed["model"]["name"] == "gpt2" and printed["schema_version"] == SCHEMA_VERSION
    assert len(printed["alternatives"]) <= 3


def test_plan_from_hf_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_LLAMA3))
    result = runner.invoke(
        app,
        [
            "plan",
            "--hf-config",
            str(config),
            "--cluster",
            "2x8xH100",
            "--seq-len",
            "4096",
            "--global-batch-tokens",
            str(4096 * 64),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"]["num_params"] == 8_030_261_248


def test_plan_with_cluster_file_and_calibration(tmp_path: Path) -> None:
    from tests.planner.test_calibration import synthetic_profile

    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"num_nodes": 1, "gpus_per_node": 8, "gpu": "H100"}))
    profile = tmp_path / "h100.json"
    profile.write_text(
        json.dumps(synthetic_profile(efficiency=0.45, overhead=1e-5, latency=2e-5, bandwidth=3e11))
    )
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster-file",
            str(cluster),
            "--seq-len",
            "4096",
            "--global-batch-tokens",
            str(4096 * 8),
            "--calibration",
            str(profile),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["calibration_id"] == "synthetic"


def test_errors_are_one_clear_line_not_a_traceback(tmp_path: Path) -> None:
    bad = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "8192",
            "--global-batch-tokens",
            "1000",
        ],
    )
    assert bad.exit_code == 2
    # The message names the option to change (not the API's field) and the batches that plan.
    assert "--global-batch-tokens: 1000 is not a whole number" in " ".join(bad.output.split())
    assert "Traceback" not in bad.output
    unknown = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            "1x8xV9000",
            "--seq-len",
            "512",
            "--global-batch-tokens",
            "4096",
        ],
    )
    assert unknown.exit_code == 2 and "unknown GPU 'V9000'" in unknown.output
    t5 = tmp_path / "t5.json"
    t5.write_text(json.dumps({"architectures": ["T5ForConditionalGeneration"]}))
    arch = runner.invoke(
        app,
        [
            "plan",
            "--hf-config",
            str(t5),
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "512",
            "--global-batch-tokens",
            "4096",
        ],
    )
    assert arch.exit_code == 2 and "unsupported architecture T5ForConditionalGeneration" in arch.output
    too_big = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama3.1-405b",
            "--cluster",
            "1x8xH100",
            "--seq-len",
            "4096",
            "--global-batch-tokens",
            str(4096 * 64),
        ],
    )
    assert too_big.exit_code == 3 and "Smallest cluster that fits" in too_big.output


# --- search pins: --tp, --sharding, --compile/--eager, --checkpointing -----------------------------

LLAMA8B_ONE_NODE = ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "8192",
                    "--global-batch-tokens", str(8192 * 16)]
# 128k-token sequences: their activations fit on an H100 only split over tensor-parallel ranks.
LONG_CONTEXT = ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "131072",
                "--global-batch-tokens", str(131072 * 8)]


WIDE = {"COLUMNS": "200"}
"""Rich wraps at 80 columns otherwise (tables and error lines alike)."""


def plan_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_tp_pin_plans_that_degree_and_prints_the_mesh() -> None:
    result = runner.invoke(app, [*LLAMA8B_ONE_NODE, "--tp", "2"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert re.search(r"Chosen: \S+ dp4x1 tp2 ", result.output), result.output
    assert re.search(r"mesh +dp_replicate 1 x dp_shard 4 x tp 2 \(sequence \+ loss parallel\)", result.output)
    exposed = re.search(r"tensor parallel\s+(\S+ \S+)/step of it \(between the matmuls", result.output)
    assert exposed, result.output
    document = plan_json(*LLAMA8B_ONE_NODE, "--tp", "2")
    mesh = {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "ep": 1, "cp": 1, "tp": 2}
    assert document["config"]["mesh"] == mesh
    assert exposed.group(1) == duration(document["prediction"]["exposed_tensor_parallel_s"])
    assert {c["config"]["mesh"]["tp"] for c in document["alternatives"]} == {2}
    assert all("tp2" in r["family"].split() for r in document["rejected"])  # nothing else searched


def test_tp_pins_repeat_or_list_and_tp_1_is_data_parallel_only() -> None:
    document = plan_json(*LLAMA8B_ONE_NODE, "--tp", "1,2", "--tp", "8")
    searched = {document["config"]["mesh"]["tp"]} | {
        int(word.removeprefix("tp")) for r in document["rejected"] for word in r["family"].split()
        if re.fullmatch(r"tp\d+", word)
    }
    assert searched == {1, 2, 8}  # the chosen degree, and a rejected family for each other one
    result = runner.invoke(app, [*LLAMA8B_ONE_NODE, "--tp", "1"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert re.search(r"mesh +dp_replicate 1 x dp_shard 8 x tp 1 \(data parallelism only\)", result.output)
    assert "tensor parallel " not in result.output and " tp2 " not in result.output


LLAMA70B_FOUR_NODES = ["plan", "--model", "llama3-70b", "--cluster", "4x8xH100", "--seq-len", "8192",
                      "--global-batch-tokens", str(8192 * 128)]


def test_out_of_memory_families_share_one_row_unless_verbose() -> None:
    """A 70B plan loses two dozen families for memory: one row by default, each with --verbose."""
    document = plan_json(*LLAMA70B_FOUR_NODES)
    oom = [r for r in document["rejected"] if r["kind"] == "oom"]
    assert len(oom) > 3  # the JSON keeps every family
    closest = min(oom, key=lambda r: (r["min_peak_memory_gib"], r["family"]))
    wider = {"COLUMNS": "300"}  # the folded row on one line
    short = runner.invoke(app, LLAMA70B_FOUR_NODES, env=wider)
    assert short.exit_code == 0, short.output
    assert short.output.count("OOM by") == 0
    line = re.search(r"│ out of memory +│ (\d+) more families do not fit: the closest, (.+?), needs "
                     r"([\d.]+) GiB per GPU, [\d.]+ GiB more than the [\d.]+ GiB that fits with the memory "
                     r"margin \(--verbose lists each\)", short.output)
    assert line, short.output
    least = f"{closest['min_peak_memory_gib']:.1f}"
    assert (int(line[1]), line[2], line[3]) == (len(oom), closest["family"], least)
    # The documentation shows this request's folded row as printed.
    assert line[0] in (Path(__file__).parents[2] / "docs" / "planning" / "index.md").read_text()
    verbose = runner.invoke(app, [*LLAMA70B_FOUR_NODES, "--verbose"], env=wider)
    assert verbose.exit_code == 0, verbose.output
    assert verbose.output.count("OOM by") == len(oom) and "--verbose lists each" not in verbose.output
    for r in document["rejected"]:
        assert re.search(rf"│ {re.escape(r['family'])} +│ {re.escape(r['reason'])}", verbose.output), r


def test_pins_of_the_other_axes() -> None:
    document = plan_json(*LLAMA8B_ONE_NODE, "--sharding", "hybrid_shard", "--eager", "--checkpointing",
                         "full", "--tp", "1")
    config = document["config"]
    assert (config["sharding"], config["compile"], config["checkpointing"]["mode"]) == (
        "hybrid_shard", False, "full"
    )
    both = plan_json(*LLAMA8B_ONE_NODE, "--sharding", "no_shard,shard_grad_op", "--compile")
    assert both["config"]["sharding"] in ("no_shard", "shard_grad_op") and both["config"]["compile"] is True
    assert all(c["config"]["compile"] for c in both["alternatives"])


def test_bad_or_unfittable_pins_are_clear_errors() -> None:
    cannot_split = runner.invoke(app, [*LLAMA8B_ONE_NODE, "--tp", "3"])
    assert cannot_split.exit_code == 2
    assert "tp=3 must divide each of num_heads 32" in cannot_split.stderr
    assert "Traceback" not in cannot_split.output
    for bad, needle in ((["--tp", "x"], "--tp: 'x' is not a tensor-parallel degree"),
                        (["--tp", "0"], "--tp: '0'"),
                        (["--sharding", "zero3"], "--sharding: 'zero3' is not one of full_shard"),
                        (["--checkpointing", "some"], "--checkpointing: 'some' is not one of none")):
        result = runner.invoke(app, [*LLAMA8B_ONE_NODE, *bad])
        assert result.exit_code == 2 and needle in result.stderr, (bad, result.output)
    gpt2 = runner.invoke(app, ["plan", "--model", "gpt2", "--cluster", "1x2xcpu", "--seq-len", "256",
                               "--global-batch-tokens", "2048", "--tp", "2"])
    assert gpt2.exit_code == 2 and "needs a llama-family model" in gpt2.stderr
    # Data parallelism alone cannot hold 128k-token activations: infeasible (exit 3), with the way out.
    infeasible = runner.invoke(app, [*LONG_CONTEXT, "--tp", "1", "--cp", "1"], env=WIDE)
    assert infeasible.exit_code == 3
    assert "does not fit" in infeasible.stderr and "tensor parallelism beyond tp=1" in infeasible.stderr
    split = plan_json(*LONG_CONTEXT)["config"]["mesh"]
    assert split["tp"] * split["cp"] > 1  # unpinned, it plans


@pytest.mark.parametrize("cluster", ["H100", "axbxH100", "1x8", "2x8H100", "1x99999999999999xcpu"])
def test_a_malformed_cluster_is_one_line_and_exit_2(cluster: str) -> None:
    # issue 22 item 11: `H100`, `axbxH100` were a traceback (exit 1); `1x8` and `2x8H100` said
    # "unknown GPU '8'" instead of showing the format. (`1X8XH100` now reads as 1x8xH100.)
    result = runner.invoke(app, ["plan", "--model", "llama-debug", "--cluster", cluster, "--seq-len", "256",
                                 "--global-batch-tokens", "2048"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    if cluster.startswith("1x9999"):
        assert line.startswith(f"error: --cluster {cluster}: 99,999,999,999,999 GPUs per node is more than "
                               "the 64 a node may hold; ask for at most 64 per node"), line
    else:
        assert line.startswith(
            f"error: --cluster {cluster}: cannot read {cluster!r} as a cluster; write NODESxGPUSxGPU"
        ), line


def test_a_cluster_file_meets_the_same_bounds(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"num_nodes": 5000, "gpus_per_node": 8, "gpu": "H100"}))
    result = runner.invoke(app, ["plan", "--model", "llama-debug", "--cluster-file", str(path), "--seq-len",
                                 "256", "--global-batch-tokens", "2048"])
    assert result.exit_code == 2 and f"--cluster-file {path}: num_nodes:" in result.stderr
    assert "4096" in result.stderr
