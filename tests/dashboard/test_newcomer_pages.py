"""What a newcomer tripped over on the dashboard: the compare page writes a configuration's switches
as the plan page does ("off", not `False` or `none`); the accuracy page keeps a run the corpus cannot
price apart from the fitted ones; the alternatives chart leaves the other points visible."""

from __future__ import annotations

import html
import re

from fastapi.testclient import TestClient

from tests.dashboard.conftest import create_plan


def row_cells(page: str, label: str) -> list[str]:
    """The cells of the table row headed `label`, as text."""
    match = re.search(rf'<th scope="row">{re.escape(label)}</th>(.*?)</tr>', page, re.S)
    assert match, label
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", match.group(1), re.S)]


def test_compare_writes_switches_as_the_plan_page_does(client: TestClient) -> None:
    first = create_plan(client, name="eight GPUs")
    second = create_plan(client, gpus_per_node="4", name="four GPUs")
    plan_page = client.get(f"/plans/{first}").text
    compare = client.get(f"/compare?ids={first},{second}").text
    for plan_label, compare_label in (
        ("Float8 training", "Float8 training"),
        ("Async tensor parallel", "Async TP"),
        ("Calibration", "Calibration"),
    ):
        shown = re.search(rf"<dt>{plan_label}</dt>\s*<dd>([^<]*)<", plan_page)
        assert shown, plan_label
        assert row_cells(compare, compare_label) == [html.unescape(shown.group(1)).strip()] * 2
    assert row_cells(compare, "Async TP") == ["off", "off"]
    assert "False" not in compare
