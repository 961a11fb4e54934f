"""`fsdp-planner trace` as a person runs it: the written file, the summary, the printed next steps
(run as printed, against a real server), and one clear line with exit status 2 for a bad factory."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from api.cli.common import SERVER_ENV
from api.cli.main import app
from planner.specs import ModelSpec

runner = CliRunner()
FACTORIES = "tests.profile.trace_models"
DEBUG = [f"{FACTORIES}:llama_debug", "--arg", "seq_len=256", "--seq-len", "256"]


def printed_command(output: str, program: str) -> str:
    """The line of the output that starts with `program`."""
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith(program)]
    assert len(lines) == 1, output
    return lines[0]


def test_trace_writes_the_graph_and_its_plan_command_plans_it(tmp_path: Path) -> None:
    graph = tmp_path / "graph.json"
    result = runner.invoke(app, ["trace", *DEBUG, "--name", "my-llama", "-o", str(graph)])

    assert result.exit_code == 0, result.output
    spec = ModelSpec.model_validate(json.loads(graph.read_text()))
    assert (spec.name, spec.architecture) == ("my-llama", "layer_graph")
    assert (spec.max_seq_len, spec.num_layers) == (256, 4)  # traced length, blocks
    assert [u.is_block for u in spec.layer_graph or []] == [False, True, True, True, True, False, False]
    assert "4,196,608 parameters" in result.output
    assert "layers.0-3" in result.output and "4 x TransformerBlock" in result.output

    plan_line = printed_command(result.output, "fsdp-planner plan")
    planned = runner.invoke(app, shlex.split(plan_line)[1:])
    assert planned.exit_code == 0, planned.output
    assert "my-llama" in planned.output and "Chosen:" in planned.output


def test_json_goes_to_stdout_alone(tmp_path: Path) -> None:
    result = runner.invoke(app, ["trace", *DEBUG, "--json", "-o", str(tmp_path / "g.json")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads((tmp_path / "g.json").read_text())
    assert "Layer graph" in result.stderr


def test_the_printed_curl_plans_on_a_real_server(server: str, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    graph = tmp_path / "graph.json"
    # The hint names the server the CLI is configured for, not a fixed 127.0.0.1:8000.
    result = runner.invoke(app, ["trace", *DEBUG, "-o", str(graph)], env={SERVER_ENV: server + "/"})
    assert result.exit_code == 0, result.output
    curl = printed_command(result.output, "curl")
    assert curl.startswith(f"curl -s {server}/api/v1/plans "), curl

    answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120, cwd=tmp_path)

    body = json.loads(answer.stdout)
    assert body["model_name"] == f"{FACTORIES}:llama_debug", body
    assert body["request"]["model"]["layer_graph"] == json.loads(graph.read_text())["layer_graph"]
    assert body["plan"]["prediction"]["tokens_per_s_per_gpu"] > 0
    assert httpx.get(f"{server}/api/v1/plans/{body['id']}").status_code == 200


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([f"{FACTORIES}.missing:build"], "cannot import 'tests.profile.trace_models.missing'"),
        ([f"{FACTORIES}:nope"], "tests.profile.trace_models has no attribute 'nope'"),
        ([FACTORIES], "write it as package.module:function"),
        ([f"{FACTORIES}:not_a_module"], "returned dict, not a torch.nn.Module"),
        ([f"{FACTORIES}:broken"], "raised RuntimeError: the checkpoint directory is missing"),
        ([f"{FACTORIES}:needs_width"], "its signature is needs_width(width): pass its arguments"),
        ([f"{FACTORIES}:needs_width", "--arg", "width"], "--arg 'width': write it as name=value"),
        ([f"{FACTORIES}:wrong_input"], "the model's forward failed on int64 tokens of shape [1, 2048]"),
    ],
    ids=["no-module", "no-attribute", "no-colon", "not-a-module", "raises", "missing-arg", "bad-arg",
         "wrong-input"],
)
def test_a_bad_factory_is_one_clear_line_and_exit_2(argv: list[str], needle: str, tmp_path: Path) -> None:
    graph = tmp_path / "graph.json"
    result = runner.invoke(app, ["trace", *argv, "-o", str(graph)])

    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and needle in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.output
    assert not graph.exists()


def test_factory_arguments_are_json_values(tmp_path: Path) -> None:
    graph = tmp_path / "graph.json"
    result = runner.invoke(
        app, ["trace", f"{FACTORIES}:needs_width", "--arg", "width=48", "--seq-len", "8", "-o", str(graph)]
    )
    assert result.exit_code == 0, result.output
    embedding, linear = ModelSpec.model_validate_json(graph.read_text()).layer_graph or []
    assert (embedding.name, embedding.num_params, embedding.fwd_flops_per_token) == ("0", 100 * 48, 0)
    assert (linear.name, linear.num_params, linear.fwd_flops_per_token) == ("1", 48 * 48 + 48, 2 * 48 * 48)
    assert "no repeated blocks found" in result.output


def test_server_plans_the_graph_in_the_same_command(server: str, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["trace", *DEBUG, "-o", str(tmp_path / "graph.json"), "--server", server, "--cluster", "1x2xcpu",
         "--global-batch-tokens", "2048"],
    )

    assert result.exit_code == 0, result.output
    assert f"planned on {server}: plan 1," in " ".join(result.output.split())
    stored = httpx.get(f"{server}/api/v1/plans/1").json()
    assert stored["model_name"] == f"{FACTORIES}:llama_debug" and stored["world_size"] == 2

    refused = runner.invoke(app, ["trace", *DEBUG, "--server", server, "--cluster", "1x3xcpu",
                                  "--global-batch-tokens", "2048", "-o", str(tmp_path / "again.json")])
    assert refused.exit_code == 2 and "cannot be split evenly over 3 GPUs" in refused.stderr


def test_server_needs_a_cluster_and_a_batch(tmp_path: Path) -> None:
    graph = tmp_path / "graph.json"
    result = runner.invoke(app, ["trace", *DEBUG, "--server", "http://127.0.0.1:9", "-o", str(graph)])
    assert result.exit_code == 2, result.output
    assert "give --cluster NODESxGPUSxGPU and --global-batch-tokens" in result.stderr
    assert not graph.exists()


def test_server_plans_the_graph_on_the_stated_network(server: str, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["trace", *DEBUG, "-o", str(tmp_path / "graph.json"), "--server", server, "--cluster", "2x1xcpu",
         "--global-batch-tokens", "2048", "--network", "10G"],
    )
    assert result.exit_code == 0, result.output
    plan = httpx.get(f"{server}/api/v1/plans/1").json()["plan"]
    assert plan["cluster"]["num_nodes"] == 2 and plan["cluster"]["inter_node_bandwidth_gbps"] == 1.25


def test_network_without_server_is_refused_before_tracing(tmp_path: Path) -> None:
    graph = tmp_path / "graph.json"
    result = runner.invoke(app, ["trace", *DEBUG, "-o", str(graph), "--network", "400G"])
    assert result.exit_code == 2, result.output
    assert "--network states the cluster's network for --server's plan" in result.stderr
    assert not graph.exists()
