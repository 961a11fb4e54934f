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


def test_the_accuracy_page_names_a_run_whose_speed_is_not_priced_instead_of_plotting_it(
    client: TestClient,
) -> None:
    """The power-capped B200 bf16 run publishes tokens/s the corpus cannot price (its cap is not
    stated): plotted, it was an ordinary point at twice its measured speed."""
    from api.dashboard.accuracy_views import corpus_speed_unpriced
    from api.services.fidelity import served_report
    from tests.dashboard.figures import figure_html

    unplotted = corpus_speed_unpriced(served_report())
    assert "b200x8-llama3-8b-sac-op-compile-bf16" in {r.run_id for r in unplotted}
    page = client.get("/accuracy").text
    chart = figure_html(page, "corpus-throughput")
    note = re.search(r'<p class="muted" id="corpus-unplotted">(.*?)</p>', page, re.S)
    assert note, "no note under the chart"
    for run in unplotted:
        assert run.run_id not in chart
        assert f"{run.source} / {run.run_id}" in html.unescape(note.group(1))
    assert "power cap" in note.group(1)
