"""The trainer reads like its phases: no function of train.py (or of the modules its command line and
phases live in) is longer than a reader can hold in view, and each flag is declared once."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from executor.runtime import options
from executor.runtime.train import parse_args

RUNTIME = Path(__file__).resolve().parents[2] / "executor" / "runtime"
CHECKED = ("train.py", "options.py")
MAX_LINES = 60


def long_functions(path: Path, limit: int = MAX_LINES) -> list[str]:
    """`name (N lines)` for each function in `path` longer than `limit` lines, decorators included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                found.append(f"{path.name}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("name", CHECKED)
def test_no_function_is_longer_than_a_screen(name: str) -> None:
    too_long = long_functions(RUNTIME / name)
    assert not too_long, f"over {MAX_LINES} lines, split into phases: " + ", ".join(too_long)


def test_the_check_names_a_long_function(tmp_path: Path) -> None:
    source = tmp_path / "long.py"
    source.write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 70)
    assert long_functions(source) == ["long.py:5 long (71 lines)"]


def test_train_is_a_driver_of_phases() -> None:
    tree = ast.parse((RUNTIME / "train.py").read_text())
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    called = {c.func.id for c in ast.walk(train) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert {"set_up", "restore", "loop", "finish"} <= called


def test_every_run_option_is_one_flag_with_its_default() -> None:
    parsed = parse_args(["--plan", "plan.json", "--synthetic-data"])
    for f in dataclasses.fields(options.RunOptions):
        if f.name in ("plan", "synthetic_data", "warmup"):
            continue
        assert getattr(parsed, f.name) == f.default, f.name
    assert parsed.warmup == 2  # 10% of the default 20 steps
    assert parse_args(["--plan", "p", "--steps", "5000", "--synthetic-data"]).warmup == 100


def test_flags_come_from_field_annotations() -> None:
    parsed = parse_args(
        ["--plan", "p", "--data", "d", "--data-dtype", "uint32", "--checkpoint-dir", "c", "--resume",
         "--no-compile", "--max-memory-gib", "1.5", "--engine", "fsdp2"]
    )
    assert parsed.checkpoint_dir == Path("c") and parsed.resume and parsed.no_compile
    assert (parsed.data, parsed.data_dtype, parsed.max_memory_gib) == ("d", "uint32", 1.5)
    assert parsed.engine == "fsdp2"
    with pytest.raises(SystemExit):
        parse_args(["--plan", "p", "--precision", "bf16"])  # not one of the Literal's choices
    with pytest.raises(SystemExit):
        parse_args([])  # --plan has no default: required


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--eval-every", "-1"], "--eval-every must be >= 0 and --eval-batches >= 1"),
        (["--max-memory-gib", "0"], "--max-memory-gib must be positive"),
    ],
)
def test_option_conflicts_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--plan", "p", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
