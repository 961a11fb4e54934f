"""`--network` on the commands that take `--cluster` (plan, whatif, trace --server): the scale-out
network per GPU as a NIC is sold (`400G`) or in GB/s (`50GB/s`), read into the cluster's
`inter_node_bandwidth_gbps` (the study's for whatif), shown where the plan and the study list what they
assumed, ending the plan's `network not stated` caveat; bad text refused naming the option, the problem
and an example. And `--cluster` counts out of bounds refused in the project's words, with what to ask
for instead."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.common import NETWORK
from api.cli.main import app
from planner.specs import LinkOverrideGbps

runner = CliRunner()
WIDE = {"COLUMNS": "240"}
# Four nodes: the network carries the data-parallel collectives, and the catalog's is assumed unless stated.
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "4x8xH100", "--global-batch-tokens", "1048576"]
WHATIF = ["whatif", "--model", "gpt2", "--tokens", "10B", "--seq-len", "1024", "--global-batch-tokens",
          "262144", "--gpu", "H100", "--sizes", "16"]


def plan_json(*extra: str) -> dict[str, typing.Any]:
    result = runner.invoke(app, [*PLAN, *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(("text", "gbps"), [
    ("400G", 50.0), ("400Gb/s", 50.0), ("400 Gbps", 50.0), ("400gbit/s", 50.0), ("800g", 100.0),
    ("1.6T", 200.0), ("50GB/s", 50.0), ("50GBps", 50.0), ("12.5GB", 12.5), ("100Gb", 12.5),
])
def test_a_bandwidth_reads_as_gb_per_s_per_gpu(text: str, gbps: float) -> None:
    assert NETWORK(text) == pytest.approx(gbps)


def test_the_bounds_are_the_cluster_fields_own() -> None:
    rules = typing.get_args(LinkOverrideGbps)[1].metadata
    low = next(r.ge for r in rules if getattr(r, "ge", None) is not None)
    high = next(r.le for r in rules if getattr(r, "le", None) is not None)
    assert (NETWORK.low, NETWORK.high) == (low, high)
    assert NETWORK(f"{low}GB/s") == low and NETWORK(f"{high * 8:g}G") == pytest.approx(high)
    # Wide enough that the option's row holds all its help.
    help_text = " ".join(runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "400"}).stdout.split())
    assert f"Range: {low * 8:,g} to {high * 8:,g} Gb/s per GPU ({low:,g} to {high:,g} GB/s)." in help_text
    assert "400G or 400Gb/s" in help_text and "GB/s, 50GB/s" in help_text


def test_a_stated_network_is_planned_on_shown_and_ends_the_caveat() -> None:
    assumed = plan_json()
    assert assumed["cluster"]["inter_node_bandwidth_gbps"] is None
    assert "does not state its network" in " ".join(w["message"] for w in assumed["warnings"])

    stated = plan_json("--network", "100G")
    assert stated["cluster"]["inter_node_bandwidth_gbps"] == 12.5
    assert not any("network" in w["message"] for w in stated["warnings"]), stated["warnings"]
    # Priced on it: a quarter of the catalog's 400G per GPU slows the step (data parallelism over nodes).
    assert stated["prediction"]["step_time_s"] > assumed["prediction"]["step_time_s"]
    assert "network not stated" not in stated["prediction"]["tokens_per_s_per_gpu_interval"]["basis"]

    table = runner.invoke(app, [*PLAN, "--network", "100Gb/s"], env=WIDE)
    assert table.exit_code == 0, table.output
    headline = " ".join(table.stdout.split("Chosen:")[0].split())
    assert "network 100 Gb/s per GPU (12.5 GB/s)" in headline
    assert "does not state its network" not in table.stdout


def test_the_caveat_names_the_option_that_states_it() -> None:
    result = runner.invoke(app, PLAN, env=WIDE)
    assert result.exit_code == 0, result.output
    assert "(--network states it)" in " ".join(result.stdout.split())


def test_network_is_stated_over_a_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"num_nodes": 4, "gpus_per_node": 8, "gpu": "H100",
                                "inter_node_bandwidth_gbps": 25.0}))
    base = ["plan", "--model", "llama3-8b", "--cluster-file", str(path), "--global-batch-tokens", "1048576",
            "--json"]
    from_file = runner.invoke(app, base)
    overridden = runner.invoke(app, [*base, "--network", "800G"])
    assert from_file.exit_code == overridden.exit_code == 0, (from_file.output, overridden.output)
    assert json.loads(from_file.stdout)["cluster"]["inter_node_bandwidth_gbps"] == 25.0
    assert json.loads(overridden.stdout)["cluster"]["inter_node_bandwidth_gbps"] == 100.0


def test_one_node_is_told_the_network_carries_nothing() -> None:
    result = runner.invoke(app, ["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq-len", "1024",
                                 "--global-batch-tokens", "262144", "--network", "400G"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "note: --network: 1x8xH100-SXM-80GB is one node" in " ".join(result.stderr.split())


@pytest.mark.parametrize(("text", "words"), [
    ("400", "'400' has no unit: write Gb/s per GPU as 400G (or 400Gb/s), or GB/s per GPU as 50GB/s"),
    ("fast", "'fast' is not a bandwidth per GPU in the digits 0-9 and a unit"),
    ("400Mbit", "is not a bandwidth per GPU"),
    ("\u0664\u0660\u0660G", "is not a bandwidth per GPU"),  # Arabic-Indic 400: not ASCII digits
    ("0G", "0G is out of range: give 0.08 to 800,000 Gb/s per GPU (0.01 to 100,000 GB/s), e.g. 400G"),
    ("-5G", "-5G is out of range"),
    ("1e9GB/s", "1e9GB/s is out of range"),
])
@pytest.mark.parametrize("command", [PLAN, WHATIF])
def test_bad_bandwidth_is_one_line_naming_the_option(command: list[str], text: str, words: str) -> None:
    result = runner.invoke(app, [*command, "--network", text], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --network: ") and words in line, line


def test_whatif_studies_every_cluster_on_the_stated_network() -> None:
    result = runner.invoke(app, [*WHATIF, "--network", "200G", "--json"])
    assert result.exit_code == 0, result.output
    study = json.loads(result.stdout)
    assert study["request"]["inter_node_bandwidth_gbps"] == 25.0
    [point] = study["points"]
    assert point["fits"] and point["num_nodes"] == 2

    unstated = json.loads(runner.invoke(app, [*WHATIF, "--json"]).stdout)
    assert "inter_node_bandwidth_gbps" not in unstated["request"]  # stored as before the field existed
    # The 80% interval no longer spreads over the networks such clusters may have.
    width = {name: p["days_interval"]["high"] - p["days_interval"]["low"]
             for name, p in (("stated", point), ("unstated", unstated["points"][0]))}
    assert width["stated"] < width["unstated"], width

    table = runner.invoke(app, [*WHATIF, "--network", "25GB/s"], env=WIDE)
    assert table.exit_code == 0, table.output
    assert "network 200 Gb/s per GPU (25 GB/s)" in table.stdout.splitlines()[0]


@pytest.mark.parametrize(("cluster", "line"), [
    ("5000x8xH100", "5,000 nodes is more than the 4,096 a plan may span; ask for at most 4,096 "
                    "(e.g. 4096x8xH100)"),
    ("1x100xH100", "100 GPUs per node is more than the 64 a node may hold; ask for at most 64 per node, "
                   "more GPUs as more nodes (e.g. 13x8xH100 is 104 GPUs)"),
    ("0x8xH100", "0 nodes: ask for at least 1 node"),
    ("2x0xA100", "0 GPUs per node: ask for at least 1 GPU per node"),
    ("1x2000xGB200", "2,000 GPUs in one scale-up domain is more than the 1,024 one fabric may join; ask for "
                     "at most 1,024 per domain, more GPUs as more domains (e.g. 28x72xGB200 is 2,016 GPUs)"),
])
def test_a_cluster_count_out_of_bounds_says_what_to_ask_for(cluster: str, line: str) -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", cluster,
                                 "--global-batch-tokens", "1048576"], env=WIDE)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [f"error: --cluster {cluster}: {line}"]
    assert "Input should be" not in result.output


def test_both_counts_out_of_bounds_are_both_named() -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", "5000x100xH100",
                                 "--global-batch-tokens", "1048576"], env=WIDE)
    assert result.exit_code == 2, result.output
    nodes, gpus = result.stderr.strip().splitlines()
    assert "5,000 nodes is more than the 4,096" in nodes and "e.g." not in nodes  # 4096x100 is no cluster
    assert "100 GPUs per node is more than the 64" in gpus


def test_a_whatif_node_out_of_bounds_is_worded_alike() -> None:
    result = runner.invoke(app, [*WHATIF[:-4], "--gpu", "100xH100", "--sizes", "16"], env=WIDE)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line == ("error: --gpu '100xH100': 100 GPUs per node is more than the 64 a node may hold; ask for "
                    "at most 64 per node, more GPUs as more nodes")
