"""`fsdp-planner plan` of a mixture of experts: its memory table splits the peak into the routed
experts', the dispatch buffers' and the dense parts', the rows the plan page shows too."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from api.cli.main import app
from planner.plan import EXPERT_MEMORY_LABELS

runner = CliRunner()
QWEN3_MOE = ["plan", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--seq-len", "4096",
             "--global-batch-tokens", "1048576", "--state-dtype", "bfloat16"]


def test_an_moe_plan_prints_its_memory_by_part_of_the_model() -> None:
    printed = runner.invoke(app, QWEN3_MOE, env={"COLUMNS": "120"})
    assert printed.exit_code == 0, printed.output
    document = runner.invoke(app, [*QWEN3_MOE, "--json"])
    assert document.exit_code == 0, document.output
    prediction = json.loads(document.output)["prediction"]
    parts, peak = prediction["expert_memory_gib"], prediction["peak_memory_gib"]

    table = printed.output.split("Of it, by part of the model", 1)[1]
    for name, label in EXPERT_MEMORY_LABELS.items():
        row = re.search(rf"│ {re.escape(label)}\s*│\s*([\d.]+) │\s*(\d+)% │", table)
        assert row, f"no row {label!r} in:\n{table}"
        assert float(row.group(1)) == round(parts[name], 2)
        assert int(row.group(2)) == round(100 * parts[name] / peak)


def test_a_dense_plan_prints_no_expert_table() -> None:
    printed = runner.invoke(app, ["plan", "--model", "gpt2", "--cluster", "1x8xH100", "--seq-len", "512",
                                  "--global-batch-tokens", "4096"], env={"COLUMNS": "120"})
    assert printed.exit_code == 0, printed.output
    assert "Of it, by part of the model" not in printed.output
