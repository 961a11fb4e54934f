"""`fsdp-planner launcher`: from a plan file, or fetched from a server by id."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from api.cli.main import app
from executor.launch.bundle import build_bundle, bundle_name
from planner.plan import Plan
from tests.executor.launch_lint import documents
from tests.executor.plan_factory import debug_plan

runner = CliRunner()


@pytest.fixture
def plan_server() -> Iterator[tuple[str, list[str]]]:
    """A stand-in API: plan 1 as the API's detail wrapper, plan 2 bare, anything else 404."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path + " " + self.headers.get("Authorization", ""))
            bodies = {
                "/api/v1/plans/1": {"id": 1, "name": "debug", "request": {}, "plan": debug_plan()},
                "/api/v1/plans/2": debug_plan(name="bare"),
            }
            if self.path in bodies:
                status, body, kind = 200, bodies[self.path], "application/json"
            else:
                status, kind = 404, "application/problem+json"
                body = {"type": "about:blank", "title": "Not Found", "status": 404, "detail": "no such plan"}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_from_plan_file_writes_archive_and_directory(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(debug_plan()))
    out = tmp_path / "out"
    result = runner.invoke(app, ["launcher", "--plan", str(plan_path), "--target", "slurm", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate(debug_plan())
    archive = out / f"{bundle_name(plan)}-slurm.tar.gz"  # one target's bundle: named after it
    # The CLI writes exactly the archive the API serves (same function, same bytes).
    assert archive.read_bytes() == build_bundle(plan, target="slurm")
    directory = out / bundle_name(plan)
    assert (directory / "launch.sh").stat().st_mode & 0o111 and (directory / "slurm.sbatch").is_file()
    assert not (directory / "k8s.yaml").exists()
    assert "DATA=/path/to/dataset ./launch.sh --steps 1000" in result.output
    assert "SYNTHETIC_DATA=1 ./launch.sh --steps 20" in result.output


def test_from_server_by_id_handles_wrapper_and_bare_plans(tmp_path: Path, plan_server) -> None:
    url, seen = plan_server
    for plan_id in ("1", "2"):
        out = tmp_path / plan_id
        result = runner.invoke(
            app,
            [
                "launcher",
                "--plan-id",
                plan_id,
                "--server",
                url,
                "--format",
                "zip",
                "-o",
                str(out),
                "--api-key",
                "k3y",
            ],
        )
        assert result.exit_code == 0, result.output
        assert len(list(out.glob("*.zip"))) == 1
    assert seen == ["/api/v1/plans/1 Bearer k3y", "/api/v1/plans/2 Bearer k3y"]


def test_missing_plan_and_unreachable_server_are_clear_errors(tmp_path: Path, plan_server) -> None:
    url, _ = plan_server
    missing = runner.invoke(app, ["launcher", "--plan-id", "99", "--server", url, "-o", str(tmp_path)])
    assert missing.exit_code == 2 and "plan 99 does not exist" in missing.output
    down = runner.invoke(
        app, ["launcher", "--plan-id", "1", "--server", "http://127.0.0.1:9", "-o", str(tmp_path)]
    )
    assert down.exit_code == 4 and "cannot reach the fsdp-planner server" in down.output
    assert "Traceback" not in missing.output + down.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one of --plan FILE or --plan-id ID"),
        (["--plan", "p.json", "--plan-id", "3"], "exactly one of"),
        (["--plan", "nope.json"], "cannot read"),
        (["--plan", "PLAN", "--target", "docker"], "--target 'docker'"),
        (["--plan", "PLAN", "--format", "rar"], "--format 'rar'"),
        (["--plan", "PLAN", "--image", "x; rm -rf /"], "container image"),
        (["--plan", "NOTPLAN"], "not a valid plan"),
    ],
)
def test_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(debug_plan()))
    wrong = tmp_path / "notplan.json"
    wrong.write_text(json.dumps({"schema_version": "1.0", "model": {}}))
    args = [str(good) if a == "PLAN" else str(wrong) if a == "NOTPLAN" else a for a in args]
    result = runner.invoke(app, ["launcher", *args, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_kubernetes_render_options(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(debug_plan()))
    out = tmp_path / "out"
    result = runner.invoke(app, [
        "launcher", "--plan", str(plan_path), "--target", "k8s", "-o", str(out),
        "--torch-version", "2.10.0", "--cuda-version", "12.8",
        "--rdma-resource", "rdma/ib", "--rdma-count", "2",
    ])
    assert result.exit_code == 0, result.output
    manifest = (out / bundle_name(Plan.model_validate(debug_plan())) / "k8s-pytorchjob.yaml").read_text()
    master = documents(manifest)["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]
    (container,) = master["template"]["spec"]["containers"]
    assert container["image"] == "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime"
    assert container["resources"]["limits"]["rdma/ib"] == 2
    refused = runner.invoke(app, [
        "launcher", "--plan", str(plan_path), "--target", "k8s", "-o", str(out), "--torch-version", "latest",
    ])
    assert refused.exit_code != 0 and "torch_version 'latest'" in refused.output


def test_kubernetes_scheduling_options(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(debug_plan()))
    out = tmp_path / "out"
    result = runner.invoke(app, [
        "launcher", "--plan", str(plan_path), "--target", "k8s", "-o", str(out), "--queue", "team-a",
        "--node-selector", "pool=training", "--node-selector", "zone=a",
        "--toleration", "nvidia.com/gpu:NoSchedule", "--priority-class", "training-high",
    ])
    assert result.exit_code == 0, result.output
    manifest = (out / bundle_name(Plan.model_validate(debug_plan())) / "k8s.yaml").read_text()
    job = documents(manifest)["TrainJob"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "training", "zone": "a"}
    assert pod["priorityClassName"] == "training-high"
    for args, message in (
        (["--queue", "Team A"], "--queue: queue 'Team A'"),
        (["--node-selector", "pool"], "--node-selector: node_selector 'pool': give key=value"),
        (["--toleration", "gpu:Sometimes"], "--toleration: toleration 'gpu:Sometimes'"),
        (["--gpu-resource", "intel.com/gpu"], "--gpu-resource: gpu_resource 'intel.com/gpu'"),
        (["--gpu-resource", "amd.com/gpu"], "--image: gpu_resource amd.com/gpu"),
    ):
        refused = runner.invoke(app, ["launcher", "--plan", str(plan_path), "--target", "k8s", "-o", str(out),
                                      *args])
        assert refused.exit_code == 2, refused.output
        assert message in " ".join(refused.output.split()), refused.output


def test_skypilot_target(tmp_path: Path) -> None:
    doc = debug_plan(nodes=2, gpus_per_node=8, sharding="hybrid_shard")
    doc["cluster"]["gpu"] = "H100-SXM-80GB"
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    args = ["launcher", "--plan", str(plan_path), "--target", "skypilot", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    bundle = out / bundle_name(Plan.model_validate(doc))
    task = yaml.safe_load((bundle / "skypilot.yaml").read_text())
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    assert (bundle / "requirements.txt").read_text() == "torch==2.13.0\n"
    doc["cluster"]["gpu"] = "H100-SXM-96GB"
    plan_path.write_text(json.dumps(doc))
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "--target: target skypilot" in " ".join(refused.output.split())
