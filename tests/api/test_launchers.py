"""GET /plans/{id}/launcher: the archive a user downloads and runs."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile

import httpx
import pytest

from tests.api.conftest import assert_problem, cheap_plan

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
    assert 'image: "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"' in manifest  # pinned, never :latest
    assert "kind: ConfigMap" in manifest and "claimName:" in manifest
    options = {"target": "k8s", "torch_version": "2.10.0", "cuda_version": "12.8",
               "rdma_resource": "rdma/rdma_shared_device_a"}
    response = await client.get(url, params=options)
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        manifest = next(archive.extractfile(m).read().decode()  # type: ignore[union-attr]
                        for m in archive.getmembers() if m.name.endswith("/k8s.yaml"))
    assert "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime" in manifest
    assert "rdma/rdma_shared_device_a: 1" in manifest
    # Versions the runtime cannot run, and names that are not resources, are a 422 naming the parameter.
    too_old = assert_problem(await client.get(url, params={"torch_version": "2.5.1"}), 422)
    assert "torch_version" in too_old["detail"]
    assert_problem(await client.get(url, params={"torch_version": "latest"}), 422)
    assert_problem(await client.get(url, params={"rdma_resource": "rdma/ib; rm -rf /"}), 422)
