"""The plan page's torchtitan download: a button for a model in torchtitan's registry, and in its place
the reason for one that is not."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.dashboard.conftest import create_plan


def test_a_llama3_plan_offers_its_torchtitan_job(client: TestClient) -> None:
    plan_id = create_plan(client, model="llama3-8b", seq_len="8192", global_batch_tokens=str(8192 * 64))
    html = client.get(f"/plans/{plan_id}").text
    link = f"/api/v1/plans/{plan_id}/launcher?target=torchtitan"
    assert f'href="{link}" download' in html
    archive = client.get(link)
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/gzip"
    legacy = f"/api/v1/plans/{plan_id}/launcher?target=torchtitan&amp;torchtitan_version=0.2"
    assert f'id="download-launcher-torchtitan-0.2" href="{legacy}" download' in html
    legacy_archive = client.get(legacy.replace("&amp;", "&"))
    assert legacy_archive.status_code == 200 and legacy_archive.headers["content-type"] == "application/gzip"
    names = [a.headers["content-disposition"].split("filename=")[1] for a in (archive, legacy_archive)]
    assert names[0].endswith('-torchtitan.tar.gz"') and names[1].endswith('-torchtitan-0.2.tar.gz"'), names


def test_a_model_torchtitan_lacks_says_why_in_place_of_the_button(client: TestClient) -> None:
    plan_id = create_plan(client)  # gpt2
    html = client.get(f"/plans/{plan_id}").text
    assert "launcher?target=torchtitan" not in html and "download-launcher-torchtitan-0.2" not in html
    assert 'id="download-launcher-torchtitan-refused">No torchtitan job: torchtitan 0.3.0' in html
    assert "registry has no model with gpt2" in html
