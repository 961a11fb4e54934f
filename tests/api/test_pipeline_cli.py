"""`fsdp-planner plan --pp N --pp-schedule NAME`: the pins reach the search space, bad values are one
clear line (exit 2), the planner's field names read as the options, and the printout shows a plan's
pipeline (schedule, stages per rank, blocks per stage)."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from api.cli.common import in_cli_terms
from api.cli.main import app
from api.cli.plan_cmd import print_plan, search_pins
from contract.parallel_config import PIPELINE_SCHEDULES
from planner.formatting import duration
from planner.specs import SearchSpace
from tests.pipeline_plans import pipeline_plan

runner = CliRunner()
DEBUG = ["plan", "--model", "llama-debug", "--cluster", "1x4xcpu", "--seq-len", "128",
         "--global-batch-tokens", "2048", "--precision", "fp32"]
WIDE = {"COLUMNS": "200"}


def pins(*, pp: list[str] | None = None, **options: list[str]) -> SearchSpace:
    return search_pins(axis_pins={"pp": pp}, **options)


def test_the_pins_reach_the_search_space() -> None:
    space = pins(pp=["2,4", "8", " 2"], pp_schedule=["ZBVZeroBubble", "1F1B,ZBVZeroBubble"])
    assert space.pipeline_parallel_degrees == [2, 4, 8]
    # De-duplicated and in the options' declared order, whatever order they were given in: requests
    # that differ only by order or duplicates search the same space and store the same plan.
    assert space.pipeline_schedules == ["1F1B", "ZBVZeroBubble"]
    unpinned = pins()
    assert unpinned.pipeline_parallel_degrees is None
    assert unpinned.pipeline_schedules == list(PIPELINE_SCHEDULES)


@pytest.mark.parametrize(("bad", "needle"), [
    (["--pp", "x"], "--pp: 'x' is not a pipeline-parallel degree; give whole numbers from 1 to 1024"),
    (["--pp", "0"], "--pp: '0' is not a pipeline-parallel degree"),
    (["--pp", "2048"], "--pp: '2048' is not a pipeline-parallel degree"),
    (["--pp", "\u0663"], "--pp: '\u0663' is not"),  # Arabic-Indic three: int() would read 3
    (["--pp", "\u00b2"], "--pp: '\u00b2' is not"),  # superscript two: isdigit(), and int() raises
    (["--pp", ","], "--pp: '(empty)' is not"),
    (["--tp", "\u00b2"], "--tp: '\u00b2' is not a tensor-parallel degree"),  # was a traceback
    (["--pp-schedule", "GPipe"], "--pp-schedule: 'GPipe' is not one of 1F1B, Interleaved1F1B, ZBVZeroBubble"),
])
def test_bad_pins_are_one_line_and_exit_2(bad: list[str], needle: str) -> None:
    result = runner.invoke(app, [*DEBUG, *bad], env=WIDE)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and "Traceback" not in result.output


def test_a_pinned_request_plans() -> None:
    result = runner.invoke(app, [*DEBUG, "--pp", "1", "--pp-schedule", "1F1B", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["mesh"]["pp"] == 1


def test_the_planner_field_names_read_as_options() -> None:
    message = "search.pipeline_parallel_degrees: pp=3 must divide 4 GPUs; search.pipeline_schedules: [] " \
        "is empty"
    assert in_cli_terms(message) == "--pp: pp=3 must divide 4 GPUs; --pp-schedule: [] is empty"
    assert in_cli_terms("widen pipeline_parallel_degrees") == "widen --pp"


@pytest.mark.parametrize(("schedule", "line"), [
    ("1F1B", "pipeline      1F1B, 1 stage(s) per rank, blocks per stage 1/3"),
    ("Interleaved1F1B", "pipeline      Interleaved1F1B, 2 stage(s) per rank, blocks per stage 1/1/1/1"),
    ("ZBVZeroBubble", "pipeline      ZBVZeroBubble, 2 stage(s) per rank, blocks per stage 1/1/1/1"),
])
def test_the_printout_shows_the_pipeline(schedule: str, line: str) -> None:
    _, plan = pipeline_plan(schedule)  # type: ignore[arg-type]
    console = Console(record=True, width=200)
    print_plan(plan, console)
    printed = console.export_text()
    mesh = "pp 2 x dp_replicate 1 x dp_shard 2 x tp 1 (blocks in 2 pipeline stages)"
    assert re.search(rf"mesh +{re.escape(mesh)}", printed)
    label, rest = line.split(maxsplit=1)
    rest += " (the first with the embeddings, the last with the head), 4 micro-batches"
    assert re.search(rf"{label} +{re.escape(rest)}", printed)
    bubble = duration(plan.prediction.pipeline_bubble_s)
    waits = f"{bubble}/step waiting while the stages fill and drain"
    assert re.search(rf"pipeline bubble +{re.escape(waits)}", printed)
    schedule = plan.config.pipeline.label()  # type: ignore[union-attr]
    assert re.search(rf"Chosen: \S+ pp2 dp\d+x\d+ tp\d+ {schedule} ", printed), printed


def test_a_plan_without_a_pipeline_prints_none() -> None:
    result = runner.invoke(app, DEBUG, env=WIDE)
    assert result.exit_code == 0, result.output
    assert "pipeline " not in result.output and "mesh          dp_replicate" in result.output
