"""What a person reads speaks their language: the command line names its options where the API names
its fields (one message, rendered per caller), no message cites this project's internal issue
numbers, counts read sensibly for tiny models and CPU ranks, and a clean run prints no warning."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.common import CLI_OPTIONS, in_cli_terms
from api.cli.main import app
from planner.catalog.models import resolve_model
from planner.errors import InfeasiblePlanError, PlanningError
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.output_checks import python_warnings

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# Data parallelism alone cannot hold one 128k-token sequence of Llama 3 8B: refused in ~2 s with
# advice that names the batch and the tensor-parallel pin (context parallelism pinned off too).
NEEDS_TP = ["--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "131072",
            "--global-batch-tokens", "1048576", "--tp", "1", "--cp", "1"]


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_cli_names_its_options_where_the_api_names_fields() -> None:
    request = PlanRequest(
        model=resolve_model("llama3-8b"), cluster=ClusterSpec.parse("1x8xH100"),
        training=TrainingSpec(seq_len=131072, global_batch_tokens=1048576),
        search=SearchSpace(tensor_parallel_degrees=[1], context_parallel_degrees=[1]),
    )
    with pytest.raises(InfeasiblePlanError) as refused:
        make_plan(request)
    api_words = refused.value.message  # what the API's problem `detail` says
    assert "widen search.tensor_parallel_degrees" in api_words and "--" not in api_words
    assert re.search(r"with global_batch_tokens \d+", api_words)

    result = runner.invoke(app, ["plan", *NEEDS_TP])
    assert result.exit_code == 3, result.output
    cli_words = one_line(result.output)
    assert "widen --tp" in cli_words and re.search(r"with --global-batch-tokens \d+", cli_words)
    assert "search.tensor_parallel_degrees" not in cli_words and "global_batch_tokens" not in cli_words
    assert cli_words == one_line(f"error: {in_cli_terms(api_words)}")  # the same message, rendered


def test_a_pin_the_model_cannot_take_names_the_option() -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--seq-len", "8192",
                                 "--global-batch-tokens", "131072", "--tp", "3"])
    assert result.exit_code == 2, result.output
    assert one_line(result.output).startswith("error: --tp: tp=3 must divide each of num_heads 32")
    # Every input it names is named as the command line sets it: the GPUs per node by --cluster.
    assert "--cluster's GPUs per node 8 (tensor parallelism" in one_line(result.output), result.output
    assert "gpus_per_node" not in result.output
    with pytest.raises(PlanningError) as api:  # the API's words for the same refusal
        make_plan(PlanRequest(
            model=resolve_model("llama3-8b"), cluster=ClusterSpec.parse("1x8xH100"),
            training=TrainingSpec(seq_len=8192, global_batch_tokens=131072),
            search=SearchSpace(tensor_parallel_degrees=[3]),
        ))
    assert api.value.field == "search.tensor_parallel_degrees"
    assert api.value.message.startswith("search.tensor_parallel_degrees: tp=3 must divide")
    assert "gpus_per_node 8" in api.value.message  # the API names its cluster's field


def test_every_mapped_option_exists_and_names_are_not_rewritten_inside_others() -> None:
    plan_help = one_line(runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "300"}).output)
    whatif_help = one_line(runner.invoke(app, ["whatif", "--help"], env={"COLUMNS": "300"}).output)
    for words in set(CLI_OPTIONS.values()):
        options = re.findall(r"--[a-z0-9-]+", words)
        assert options, words
        for spelling in options:
            assert spelling in plan_help or spelling in whatif_help, spelling
    assert in_cli_terms("max_seq_len 1024, model.seq_len, --seq-len, plan.training.seq_len") == (
        "max_seq_len 1024, model.seq_len, --seq-len, plan.training.seq_len"
    )
    assert in_cli_terms("training.seq_len: use seq_len <= 1024") == "--seq-len: use --seq-len <= 1024"


def test_a_tiny_model_on_cpu_reads_in_millions_of_parameters_and_cpu_processes() -> None:
    result = runner.invoke(app, ["plan", "--model", "llama-debug", "--cluster", "1x2xcpu", "--seq-len", "64",
                                 "--global-batch-tokens", "512", "--precision", "fp32"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("llama-debug (4.2M params) on 1x2 cpu (2 CPU processes), seq 64"), first
    assert ClusterSpec.parse("2x8xH100").ranks() == "16 GPUs"
    assert ClusterSpec.parse("1x1xcpu").ranks() == "1 CPU process"


# A reference to this project's issue tracker ("issue 11", "issues 3-4", "#11" after "issue").
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def user_visible_strings(path: Path) -> list[tuple[int, str]]:
    """String literals of a module that can reach a person: every one but docstrings and other bare
    string statements (attribute docs), which only readers of the code see."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_no_user_visible_text_cites_an_internal_issue_number() -> None:
    found = []
    for package in ("contract", "planner", "api", "executor"):
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}: {text!r}"
                      for line, text in user_visible_strings(path) if ISSUE_NUMBER.search(text)]
        for suffix in ("*.html", "*.js", "*.css", "*.md"):
            for path in sorted((ROOT / package).rglob(suffix)):
                found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}"
                          for m in ISSUE_NUMBER.finditer(path.read_text(encoding="utf-8"))]
    # The committed fit's reasons are shown with every uncalibrated plan; the split's rule and reasons are
    # where the accuracy page sends a reader.
    for resource in ("report.json", "split.json"):
        path = ROOT / "planner" / "fidelity" / resource
        found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}"
                  for m in ISSUE_NUMBER.finditer(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_scan_sees_strings_and_skips_docstrings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Fixed in issue 11."""\nX = 1\n"""The margin (issue 12)."""\n'
                      'REASON = f"covers that (issue {X + 10})"\nOTHER = "see Issue #4"\n')
    hits = [text for _, text in user_visible_strings(module) if ISSUE_NUMBER.search(text)]
    assert hits == ["see Issue #4"]  # the f-string's parts are split: `(issue ` alone has no number
    assert not ISSUE_NUMBER.search("issued 4 all-gathers")


# ------------------------------------------------------------------ a clean run prints no warning


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command line as a person runs it, with every Python warning made an error."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-W", "error", "-m", "api.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_plan_and_launcher_run_clean_with_warnings_as_errors(tmp_path: Path) -> None:
    planned = run_cli("plan", "--model", "llama-debug", "--cluster", "1x2xcpu", "--seq-len", "64",
                      "--global-batch-tokens", "512", "--precision", "fp32", "-o", "plan.json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert planned.stderr == "" and not python_warnings(planned.stdout)
    bundled = run_cli("launcher", "--plan", "plan.json", "--target", "all", "-o", "bundles", cwd=tmp_path)
    assert bundled.returncode == 0, bundled.stderr
    assert bundled.stderr == "" and not python_warnings(bundled.stdout)


def test_torch_imports_without_a_warning() -> None:
    # torch's wheels warn at every import without numpy ("Failed to initialize NumPy"): once per
    # process of every bundle, calibration and validation run. The executor extra installs numpy.
    pytest.importorskip("torch", reason="the executor extra is not installed")
    result = subprocess.run([sys.executable, "-W", "error", "-c", "import torch"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_warning_detector_sees_what_runs_printed() -> None:
    seen = (
        "/x/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to initialize NumPy\n"
        "/x/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` "
        "is deprecated.\n"
        "[rank1]:W1126 04:57:00.542000 27228 torch/_logging/_internal.py:1345] [0/0] Detected that ...\n"
        "launch.sh: cluster environment\n  NCCL_DEBUG=WARN\n"
        "WARNING: training on SYNTHETIC tokens (--synthetic-data).\n"
    )
    assert len(python_warnings(seen)) == 3
