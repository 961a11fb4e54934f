"""GET /plans/{id}/launcher: the archive a user downloads and runs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from contract.plan_document import SCHEMA_VERSION
from tests.api.conftest import assert_problem, cheap_plan
from tests.older_schemas import as_schema_1, as_schema_2_0

pytestmark = pytest.mark.anyio

PLANS = "/api/v1/plans"


async def test_tar_gz_bundle_holds_the_stored_plan_and_the_launchers(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan(name='x"; rm -rf ~; "'))).json()
    response = await client.get(f"{PLANS}/{plan['id']}/launcher")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/gzip"
    assert "attachment" in response.headers["content-disposition"]
    assert ".tar.gz" in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        names = archive.getnames()
        root = names[0].split("/")[0]
        assert {f"{root}/launch.sh", f"{root}/slurm.sbatch", f"{root}/k8s.yaml", f"{root}/plan.json"} <= set(
            names
        )
        assert any(n.startswith(f"{root}/executor/runtime/") for n in names)
        stored = json.loads(archive.extractfile(f"{root}/plan.json").read())  # type: ignore[union-attr]
        launch = archive.getmember(f"{root}/launch.sh")
    assert stored == plan["plan"]
    assert launch.mode & 0o111  # executable


async def test_zip_and_single_target(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    response = await client.get(f"{PLANS}/{plan['id']}/launcher", params={"target": "slurm", "format": "zip"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(response.content)).namelist()
    assert any(n.endswith("/slurm.sbatch") for n in names)
    assert not any(n.endswith("/k8s.yaml") for n in names)


async def test_bad_requests_are_clear(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    assert_problem(await client.get(f"{PLANS}/999999/launcher"), 404, "plan-not-found")
    assert_problem(await client.get(f"{PLANS}/{plan['id']}/launcher", params={"target": "mpi"}), 422)
    hostile = await client.get(f"{PLANS}/{plan['id']}/launcher", params={"image": "x; rm -rf /"})
    problem = assert_problem(hostile, 422)
    assert "image" in problem["detail"]


async def test_kubernetes_render_options(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    url = f"{PLANS}/{plan['id']}/launcher"
    response = await client.get(url, params={"target": "k8s"})
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        manifest = next(archive.extractfile(m).read().decode()  # type: ignore[union-attr]
                        for m in archive.getmembers() if m.name.endswith("/k8s.yaml"))
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(manifest)}
    trainer = documents["TrainJob"]["spec"]["trainer"]
    assert trainer["image"] == "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"  # pinned, never :latest
    assert "kind: ConfigMap" in manifest and "claimName:" in manifest
    options = {"target": "k8s", "torch_version": "2.10.0", "cuda_version": "12.8",
               "rdma_resource": "rdma/rdma_shared_device_a"}
    response = await client.get(url, params=options)
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        manifest = next(archive.extractfile(m).read().decode()  # type: ignore[union-attr]
                        for m in archive.getmembers() if m.name.endswith("/k8s.yaml"))
    trainer = {doc["kind"]: doc for doc in yaml.safe_load_all(manifest)}["TrainJob"]["spec"]["trainer"]
    assert trainer["image"] == "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime"
    assert trainer["resourcesPerNode"]["limits"]["rdma/rdma_shared_device_a"] == 1
    # Versions the runtime cannot run, and names that are not resources, are a 422 naming the parameter.
    too_old = assert_problem(await client.get(url, params={"torch_version": "2.5.1"}), 422)
    assert "torch_version" in too_old["detail"]
    assert_problem(await client.get(url, params={"torch_version": "latest"}), 422)
    assert_problem(await client.get(url, params={"rdma_resource": "rdma/ib; rm -rf /"}), 422)


@pytest.mark.distributed
async def test_stored_plans_of_every_schema_launch_from_their_bundle(
    client: httpx.AsyncClient, session: Session, backend: str, tmp_path: Path
) -> None:
    # Rows as each older planner stored them (2.0; 1.2; 1.1 without replica counts; 1.0 with its old
    # memory-term names) beside a current one: each bundle's own runtime and contract (no PYTHONPATH
    # to this repository) read its plan.json as the current mesh, and the oldest one trains.
    body = cheap_plan(
        training={"seq_len": 64, "global_batch_tokens": 64 * 8, "precision": "fp32"},
        search={"compile": [False], "tensor_parallel_degrees": [1]},
    )
    current = (await client.post(PLANS, json=body)).json()
    older = {
        "2.0": as_schema_2_0,
        "1.2": as_schema_1,
        "1.1": lambda plan: as_schema_1(plan, "1.1", replica_counts=False),
        "1.0": lambda plan: as_schema_1(plan, "1.0"),
    }
    plans = [current]
    for version, write in older.items():
        plan = (await client.post(PLANS, json={**body, "name": f"stored by {version}"})).json()
        row = session.get(PlanRow, plan["id"])
        assert row is not None
        row.plan = write(row.plan)
        assert row.plan["schema_version"] == version
        plans.append(plan)
    session.commit()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPROC_PER_NODE", "NNODES")}
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", SYNTHETIC_DATA="1")
    for plan in plans:
        shown = await client.get(f"{PLANS}/{plan['id']}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["mesh"] == current["mesh"]
        page = await client.get(f"/plans/{plan['id']}")
        assert page.status_code == 200, page.text
        response = await client.get(f"{PLANS}/{plan['id']}/launcher")
        assert response.status_code == 200, response.text
        with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
            archive.extractall(tmp_path / str(plan["id"]), filter="data")
        (bundle,) = (tmp_path / str(plan["id"])).iterdir()
        read = subprocess.run(
            [sys.executable, "-c", READ_WITH_THE_BUNDLE], cwd=bundle, env=env, capture_output=True, text=True,
            check=False,
        )
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout) == {
            "schema_version": SCHEMA_VERSION, "contract": str(bundle / "contract"),
            "mesh": current["plan"]["config"]["mesh"],
        }
    if backend != "sqlite":
        return  # the database is not what the launch tests: once is enough
    launch = subprocess.run(
        ["./launch.sh", "--steps", "2"], cwd=bundle, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert "done: 2 steps" in launch.stdout


READ_WITH_THE_BUNDLE = """
import json, pathlib, contract
from contract.plan_document import load_plan
plan = load_plan("plan.json")
where = str(pathlib.Path(contract.__file__).parent)
mesh = plan.config.mesh.as_document()
print(json.dumps({"schema_version": plan.schema_version, "contract": where, "mesh": mesh}))
"""
"""Run inside an unpacked bundle: its own contract reads its plan.json."""


async def test_kubernetes_scheduling_options(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    url = f"{PLANS}/{plan['id']}/launcher"
    options = {
        "target": "k8s", "queue": "team-a", "node_selector": ["pool=training", "zone=a"],
        "toleration": ["nvidia.com/gpu:NoSchedule"], "priority_class": "training-high",
    }
    response = await client.get(url, params=options)
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        manifest = next(archive.extractfile(m).read().decode()  # type: ignore[union-attr]
                        for m in archive.getmembers() if m.name.endswith("/k8s-pytorchjob.yaml"))
    job = {doc["kind"]: doc for doc in yaml.safe_load_all(manifest)}["PyTorchJob"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["runPolicy"]["suspend"] is True
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "training", "zone": "a"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "training-high"
    # Bad values are a 422 naming the parameter.
    for bad, field in (
        ({"queue": "Team A"}, "queue"),
        ({"node_selector": ["pool"]}, "node_selector"),
        ({"toleration": ["gpu:Sometimes"]}, "toleration"),
        ({"priority_class": "High"}, "priority_class"),
        ({"gpu_resource": "intel.com/gpu"}, "gpu_resource"),
        ({"gpu_resource": "amd.com/gpu"}, "image"),  # PyTorch's official image is a CUDA build
    ):
        problem = assert_problem(await client.get(url, params={"target": "k8s", **bad}), 422)
        assert field in json.dumps(problem), (bad, problem)
    rocm = await client.get(url, params={"target": "k8s", "gpu_resource": "amd.com/gpu",
                                          "image": "rocm/pytorch:latest-release"})
    assert rocm.status_code == 200, rocm.text


async def test_skypilot_target(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan())).json()
    response = await client.get(f"{PLANS}/{plan['id']}/launcher", params={"target": "skypilot"})
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        by_name = {m.name.split("/", 1)[1]: m for m in archive.getmembers()}
        assert {"skypilot.yaml", "requirements.txt", "launch.sh", "plan.json"} <= set(by_name)
        assert "k8s.yaml" not in by_name
        task = yaml.safe_load(archive.extractfile(by_name["skypilot.yaml"]).read())  # type: ignore[union-attr]
    assert task["num_nodes"] == plan["plan"]["cluster"]["num_nodes"]
    assert "SKYPILOT_NODE_IPS" in task["run"]


def test_every_target_is_offered_everywhere() -> None:
    from api.dashboard.pages import LAUNCHER_TARGETS
    from api.routers.launchers import LaunchTarget
    from executor.launch.bundle import TARGETS

    offered = [query.split("&")[0].removeprefix("target=") for _, query, _ in LAUNCHER_TARGETS]
    assert [t.value for t in LaunchTarget] == list(TARGETS) == list(dict.fromkeys(offered))


async def test_an_amd_plans_bundle_asks_for_amd_gpus_in_a_rocm_image(client: httpx.AsyncClient) -> None:
    plan = (await client.post(PLANS, json=cheap_plan(cluster="1x8xMI300X"))).json()
    url = f"{PLANS}/{plan['id']}/launcher"

    def trainer(response: httpx.Response) -> dict:
        assert response.status_code == 200, response.text
        with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
            (member,) = [m for m in archive.getmembers() if m.name.endswith("/k8s.yaml")]
            text = archive.extractfile(member).read().decode()  # type: ignore[union-attr]
        (job,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "TrainJob"]
        return job["spec"]["trainer"]

    default = trainer(await client.get(url, params={"target": "k8s"}))
    assert default["resourcesPerNode"]["limits"] == {"amd.com/gpu": 8}
    assert default["image"] == "rocm/pytorch:rocm7.2_ubuntu24.04_py3.12_pytorch_release_2.13.0"
    older = trainer(await client.get(url, params={"target": "k8s", "rocm_version": "6.4.1",
                                                  "torch_version": "2.9.0"}))
    assert older["image"] == "rocm/pytorch:rocm6.4.1_ubuntu24.04_py3.12_pytorch_release_2.9.0"
    # NVIDIA GPUs for an AMD plan need an image with a CUDA build of torch.
    nvidia = await client.get(url, params={"target": "k8s", "gpu_resource": "nvidia.com/gpu"})
    problem = assert_problem(nvidia, 422)
    assert "image" in json.dumps(problem)
