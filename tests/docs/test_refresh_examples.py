"""`scripts/refresh_doc_examples.py` on a small synthetic page: a shown line is matched to the fresh
output's line by its skeleton (figures and spacing free), so the figures change and nothing else does:
the page's elisions and its choice of lines stay, a line whose skeleton nothing printed is left for a
human, and the prose around the code blocks is never written."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs import examples as ex

PAGE = """\
# A page

The plan, in prose with figures that must stay: 7,863 tokens/s and 46.0%.

    fsdp-planner plan --model llama3-8b --cluster 1x8xH100 --seq-len 8192

    llama3-8b (8.03B params) on 1x8 H100-SXM-80GB (8 GPUs), seq 8192, 131,072 tokens/step, uncalibrated
    Chosen: shard_grad_op dp8x1 tp1 u1 AC=op mb2x1 ag512/rs512MB compiled
    ...
    tokens/s/GPU  7,863 (6,918–8,936)
    │ activations         │ 33.09 │   49% │ ...
    │ ...
    warning: an old warning with 3 figures
    │ hybrid_shard dp2x4 tp1 compiled  │ OOM by 8.8 GiB: needs at least 76.5 GiB per GPU │

More prose: 2.08 s.
"""

PRINTED = """\
llama3-8b (8.03B params) on 1x8 H100-SXM-80GB (8 GPUs), seq 8192, 131,072 tokens/step, uncalibrated
Chosen: shard_grad_op dp8x1 tp1 u1 AC=op mb2x1 ag512/rs512MB compiled
step time     2.01 s
tokens/s/GPU  8,120 (7,010–9,204)
│ activations           │ 133.10 │  51% │ 41 │
│ gathered parameters   │ 14.96 │  22% │ 12 │
a new warning the page does not show
│ hybrid_shard dp2x4 tp1 compiled  │ OOM by 10.2 GiB: needs at least 78.0 GiB per GPU │
"""


def load_script() -> ModuleType:
    path = ex.REPO / "scripts" / "refresh_doc_examples.py"
    spec = importlib.util.spec_from_file_location("refresh_doc_examples", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def page(tmp_path: Path) -> Path:
    path = tmp_path / "page.md"
    path.write_text(PAGE, encoding="utf-8")
    return path


def test_the_skeleton_frees_figures_but_not_names() -> None:
    assert ex.skeleton("│ dp8x1 ag512/rs512MB │ 7,863 (6,918–8,936) │  -3.2% │ $88.1M │ 1.26x") == (
        "│ dp8x1 ag512/rs512MB │ # (#–#) │ #% │ $# │ #")
    assert ex.skeleton("llama3-8b on 1x8 H100 (8 GPUs)") == "llama3-8b on 1x8 H100 (# GPUs)"
    assert ex.skeleton("9594 configurations evaluated, 307 fit; plan 334a98e0a78c") == (
        "# configurations evaluated, # fit; plan #")


def test_the_example_carries_the_page_line_of_each_shown_line(page: Path) -> None:
    [example] = ex.page_examples(page, "fsdp-planner plan ")
    lines = PAGE.splitlines()
    assert example.line == 5
    assert [lines[n - 1].removeprefix("    ") for n in example.output_lines] == example.output


def test_shown_lines_take_the_new_figures_and_keep_their_elisions(page: Path) -> None:
    [example] = ex.page_examples(page, "fsdp-planner plan ")
    refreshed = ex.refresh_lines(example.output, PRINTED.splitlines())
    assert [r.new for r in refreshed] == [
        PRINTED.splitlines()[0],
        PRINTED.splitlines()[1],
        "...",
        "tokens/s/GPU  8,120 (7,010–9,204)",
        "│ activations           │ 133.10 │  51% │ ...",  # the cut stays where the page made it
        "│ ...",
        None,  # nothing printed has this line's skeleton: a human decides
        "│ hybrid_shard dp2x4 tp1 compiled  │ OOM by 10.2 GiB: needs at least 78.0 GiB per GPU │",
    ]
    for r in refreshed:
        if r.new is not None:
            assert ex.skeleton(r.new) == ex.skeleton(r.shown)


def test_a_line_is_matched_in_the_order_the_page_shows_it() -> None:
    printed = ["│ a row │ 1.0 │", "│ total │ 3.0 │", "│ a row │ 2.0 │"]
    refreshed = ex.refresh_lines(["│ total │ 9.0 │", "│ a row │ 9.0 │"], printed)
    assert [r.new for r in refreshed] == ["│ total │ 3.0 │", "│ a row │ 2.0 │"]


def test_a_line_the_printout_wrapped_is_read_as_one() -> None:
    printed = ["Peak memory per GPU (at backward   ", "recompute)   ", "│ activations │ 3.0 │"]
    refreshed = ex.refresh_lines(["Peak memory per GPU (at backward recompute)", "│ activations │ 9.0 │"],
                                 printed)
    assert [r.new for r in refreshed] == ["Peak memory per GPU (at backward recompute)",
                                          "│ activations │ 3.0 │"]


def test_another_name_is_not_the_same_line() -> None:
    printed = ["│ full_shard dp4x1 tp2 compiled │ 3% slower │"]
    [refreshed] = ex.refresh_lines(["│ full_shard dp8x1 tp1 compiled │ 3% slower │"], printed)
    assert refreshed.new is None


def test_a_refusal_keeps_its_line_breaks() -> None:
    shown = ["error: needs 80.5 GiB per GPU,", "  78.6 GiB usable"]
    assert ex.refresh_refusal(shown, "error: needs 80.5 GiB per GPU, 78.6 GiB usable\n") == shown
    assert ex.refresh_refusal(shown, "error: needs 81.25 GiB per GPU, 78.6 GiB usable\n") == [
        "error: needs 81.25 GiB per GPU,", "  78.6 GiB usable"]  # the page's breaks, not its width
    assert ex.refresh_refusal(shown, "error: needs 81.25 GiB per GPU, 78.6 GiB usable of 80\n") == [
        "error: needs 81.25 GiB per GPU,", "  78.6 GiB usable"]  # what the page leaves out stays out
    assert ex.refresh_refusal(shown, "error: another reason\n") is None


def test_an_answer_keeps_its_digits_and_its_elisions() -> None:
    line = '"tokens_per_s_per_gpu":7862.6,"mfu":0.460,"id":1,"mesh":{"pp":1,"tp":1},...}'
    answer = {"tokens_per_s_per_gpu": 7901.04, "mfu": 0.46249, "id": 7, "mesh": {"tp": 2, "pp": 1, "cp": 1}}
    assert ex.refresh_answer_line(line, answer) == (
        '"tokens_per_s_per_gpu":7901.0,"mfu":0.462,"id":1,"mesh":{"pp":1,"tp":2},...}')


def test_the_tool_writes_code_blocks_and_never_prose(page: Path) -> None:
    script = load_script()
    [example] = ex.page_examples(page, "fsdp-planner plan ")
    edits = script.PageEdits(page=page)
    for number, r in zip(example.output_lines, ex.refresh_lines(example.output, PRINTED.splitlines()),
                         strict=True):
        if r.new is not None and r.new != r.shown:
            edits.lines[number] = [r.new]
    new = script.apply(edits, script.dedented_lines(PAGE))
    before, after = PAGE.splitlines(), new.splitlines()
    assert len(after) == len(before)  # no line lost
    changed = [n for n, (a, b) in enumerate(zip(before, after, strict=True), start=1) if a != b]
    assert changed == [10, 11, 14]
    assert "    tokens/s/GPU  8,120 (7,010–9,204)" in after
    assert "    warning: an old warning with 3 figures" in after  # left for a human, untouched
    assert "7,863 tokens/s and 46.0%" in new and "More prose: 2.08 s." in new

    edits.lines[3] = ["The plan, in prose with other figures."]
    with pytest.raises(SystemExit, match="prose"):
        script.apply(edits, script.dedented_lines(PAGE))
