"""An expert-parallel plan on the dashboard: its page shows the dispatch and combine all-to-alls'
time apart from the tensor-parallel collectives', and compare has a row for it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.dashboard import formatting as fmt
from tests.dashboard.conftest import create_plan
from tests.dashboard.test_moe_pages import QWEN3_MOE_FORM
from tests.dashboard.test_tensor_parallel_pages import text


def test_an_ep_plan_page_and_compare_show_the_all_to_alls(client: TestClient) -> None:
    ep8 = create_plan(client, **QWEN3_MOE_FORM, expert_parallel_degree="8", name="qwen3 ep8")
    prediction = client.get(f"/api/v1/plans/{ep8}").json()["plan"]["prediction"]
    seconds = prediction["exposed_expert_parallel_s"]
    assert seconds > 0
    page = text(client.get(f"/plans/{ep8}").text)
    assert f"Expert-parallel communication {fmt.duration(seconds)} per step, all exposed: the ep=8" in page
    assert f"expert parallel {fmt.duration(seconds)}" in page

    dense = create_plan(client, name="gpt2 dense")
    assert "Expert-parallel communication" not in text(client.get(f"/plans/{dense}").text)
    compared = text(client.get(f"/compare?ids={ep8},{dense}").text)
    assert f"of which expert parallel {fmt.duration(seconds)} {fmt.duration(0.0)}" in compared
