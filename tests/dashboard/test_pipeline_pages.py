"""Pipeline parallelism on the dashboard, server-side: the mesh row names pp, the Pipeline section lists
the stages and draws the schedule's timeline (SVG, no script), the list filters on pp and the compare
page shows it. The pp plans are built from a real plan with the contract's dataclasses
(tests/pipeline_plans.py)."""

from __future__ import annotations

import html as html_module
import re
import xml.etree.ElementTree as ET

import pytest
from fastapi.testclient import TestClient

from api.dashboard import formatting as fmt
from api.services.plans import row_for
from contract.parallel_config import PipelineSchedule
from planner.cost.pipeline import bubble_seconds
from planner.pipeline_timeline import UNIT_CHUNK, simulate
from tests.dashboard.conftest import DEBUG_CPU_FORM, Database, create_plan
from tests.dashboard.test_pages import row_ids
from tests.dashboard.test_tensor_parallel_pages import mesh_cells, text
from tests.pipeline_plans import digest, pipeline_plan

SVG = "{http://www.w3.org/2000/svg}"


def store(db: Database, schedule: PipelineSchedule, *, name: str, pp: int = 2, world: int = 4) -> int:
    request, plan = pipeline_plan(schedule, pp=pp, world=world)
    with db.session() as session:
        row = row_for(request, plan, digest(request, plan), name=name, calibration_id=None)
        session.add(row)
        session.commit()
        return row.id


def timeline_svg(html: str) -> ET.Element:
    figure = re.search(r'<figure class="chart pipeline-timeline" id="pipeline-timeline">\s*(<svg.*?</svg>)',
                       html, re.S)
    assert figure, "no pipeline timeline"
    return ET.fromstring(figure.group(1))  # well-formed XML, or this raises


def boxes(svg: ET.Element) -> list[tuple[str, str]]:
    """(kind, tooltip) of every action box."""
    return [(g.get("data-kind", ""), g.find(f"{SVG}rect/{SVG}title").text or "")  # type: ignore[union-attr]
            for g in svg.iter(f"{SVG}g")]


def test_a_1f1b_plan_shows_its_mesh_stages_and_timeline(client: TestClient, db: Database) -> None:
    plan_id = store(db, "1F1B", name="debug pp2")
    html = client.get(f"/plans/{plan_id}").text
    page = text(html)
    assert "Device mesh pp 2 × dp_replicate 1 × dp_shard 2 × tp 1" in page
    assert "split into 2 pipeline stages of 2 GPU(s) each" in page
    assert "· full_shard pp2 dp2x1 tp1 1F1B u" in page  # the configuration label in the subtitle
    # The stages: blocks with their global indices, where the embeddings and the head are.
    stages = re.search(r'<table class="data" id="stages-table">(.*?)</table>', html, re.S)
    assert stages
    rows = [text(r) for r in re.findall(r"<tr data-stage=\"\d+\">(.*?)</tr>", stages.group(1), re.S)]
    assert rows == ["0 0 0 1 embeddings", "1 1 1–3 3 final norm, head and loss"]
    assert "Schedule 1F1B" in page and "Blocks per stage 1 / 3" in page
    assert "Micro-batches 4 per step" in page

    svg = timeline_svg(html)
    drawn = boxes(svg)
    assert sorted({kind for kind, _ in drawn}) == ["backward", "forward"]
    assert len(drawn) == 2 * 2 * 4  # pp 2 ranks x forward and backward x 4 micro-batches
    assert any(tooltip.startswith("rank 1, stage 1: backward of micro-batch 3, ") for _, tooltip in drawn)
    labels = [t.text for t in svg.iter(f"{SVG}text") if (t.text or "").startswith("rank")]
    assert labels == ["rank 0", "rank 1"]
    assert "rank 0 : F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3" in text(html)  # torch's order, as words
    assert "<script" not in html.split('id="pipeline"')[1].split("</section>")[0]


@pytest.mark.parametrize(("schedule", "kinds"), [
    ("Interleaved1F1B", ["backward", "forward"]),
    ("ZBVZeroBubble", ["forward", "input gradient", "weight gradient"]),
])
def test_the_other_schedules_draw_their_stages(
    client: TestClient, db: Database, schedule: PipelineSchedule, kinds: list[str]
) -> None:
    plan_id = store(db, schedule, name=f"debug {schedule}")
    html = client.get(f"/plans/{plan_id}").text
    drawn = boxes(timeline_svg(html))
    assert sorted({kind for kind, _ in drawn}) == kinds
    assert len(drawn) == 2 * 2 * 4 * len(kinds)  # pp 2 x 2 stages per rank x 4 micro-batches x kinds
    stages = re.findall(r'<tr data-stage="(\d+)"><td>\d+</td><td>(\d+)</td>', html)
    # Looped (stage s on rank s mod pp) or a V (rank 0 holds the first and the last stage).
    expected = [0, 1, 0, 1] if schedule == "Interleaved1F1B" else [0, 1, 1, 0]
    assert [int(rank) for _, rank in stages] == expected
    assert "A rank's later stages are drawn lighter" in html


def test_the_bubble_shown_is_the_simulated_one(client: TestClient, db: Database) -> None:
    plan_id = store(db, "1F1B", name="debug pp2", pp=4, world=4)
    html = client.get(f"/plans/{plan_id}").text
    page = text(html)
    plan = client.get(f"/api/v1/plans/{plan_id}").json()["plan"]
    forward = sum(s["end_s"] - s["start_s"] for s in plan["prediction"]["timeline"]
                  if s["stream"] == "compute" and s["phase"] == "forward")
    backward = sum(s["end_s"] - s["start_s"] for s in plan["prediction"]["timeline"]
                   if s["stream"] == "compute" and s["phase"] == "backward")
    # 1F1B over 4 stages and 4 micro-batches: 3 chunks of bubble in a step of 7.
    bubble = 3 * (forward + backward)
    share = fmt.percent(bubble / (7 * (forward + backward)))
    assert f"the timeline below, simulated: {share} of the drawn step: {fmt.duration(bubble)} of " in page
    assert len(boxes(timeline_svg(html))) == 4 * 2 * 4


def test_unit_durations_agree_with_the_cost_model() -> None:
    """The figure's idle with unit durations is the cost model's 1F1B bubble ((pp - 1) chunks)."""
    _, plan = pipeline_plan("1F1B", pp=4, world=4)
    assert plan.config.pipeline is not None
    timeline = simulate(plan.config.pipeline, pp=4, micro_batches=4, chunk=UNIT_CHUNK)
    assert timeline.bubble_s == bubble_seconds("1F1B", pp=4, chunk=UNIT_CHUNK, micro_batches=4) == 9.0


def test_a_plan_without_a_pipeline_has_no_pipeline_section(client: TestClient) -> None:
    plan_id = create_plan(client)
    html = client.get(f"/plans/{plan_id}").text
    assert 'id="pipeline"' not in html and "Device mesh dp_replicate" in text(html)


def test_the_list_and_compare_show_pp(client: TestClient, db: Database) -> None:
    pipelined = store(db, "Interleaved1F1B", name="debug pp2")
    flat = create_plan(client, **{**DEBUG_CPU_FORM, "gpus_per_node": "4", "seq_len": "128",
                                  "global_batch_tokens": "2048"}, name="debug flat")
    html = client.get("/").text
    cells = mesh_cells(html)
    assert cells[pipelined] == "full_shard pp2 dp2x1 tp1"
    assert "pp" not in cells[flat]
    assert re.search(rf'<tr data-plan-id="{pipelined}">.*?data-pp="2"', html, re.S)
    options = re.findall(r'<select name="pp" id="filter-pp">(.*?)</select>', html, re.S)[0]
    assert "pp 1 (none)" in options and '<option value="2">pp 2</option>' in options

    assert row_ids(client.get("/?pp=2").text) == [pipelined]
    assert row_ids(client.get("/?pp=1").text) == [flat]
    for bogus in ("x", "0", "\u0663", "\u00b2", "2000"):
        response = client.get("/", params={"pp": bogus})
        assert response.status_code == 200 and len(row_ids(response.text)) == 2, bogus
        assert "Pipeline parallel must be a whole number from 1 to 1024" in response.text

    page = text(client.get(f"/compare?ids={pipelined},{flat}").text)
    assert "Pipeline stages (pp) 2 stages none (1)" in page
    assert "Pipeline schedule Interleaved1F1Bx2 –" in page


def test_the_form_pins_a_pipeline_and_plan_again_keeps_it(client: TestClient) -> None:
    four = {**DEBUG_CPU_FORM, "gpus_per_node": "4", "seq_len": "128", "global_batch_tokens": "2048"}
    plan_id = create_plan(client, **four, pipeline_parallel_degree="2", name="debug pp2")
    stored = client.get(f"/api/v1/plans/{plan_id}").json()
    assert stored["request"]["search"]["pipeline_parallel_degrees"] == [2]
    assert stored["plan"]["config"]["mesh"]["pp"] == 2
    html = client.get(f"/plans/{plan_id}").text
    again = re.search(r'href="(/plans/new\?[^"]+)" id="replan"', html)
    assert again and "pipeline_parallel_degree=2" in again.group(1)
    form = client.get(html_module.unescape(again.group(1))).text
    assert re.search(r'id="pipeline_parallel_degree"[^>]*value="2"', form)
    # Bad input is named at the field, the form comes back as sent.
    refused = client.post("/plans/new", data={**four, "pipeline_parallel_degree": "²"})
    assert refused.status_code == 422
    assert "enter a whole number from 1 to 1024 (1: none)" in refused.text
    assert re.search(r'id="pipeline_parallel_degree"[^>]*aria-invalid="true"', refused.text)
