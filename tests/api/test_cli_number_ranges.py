"""Numbers typed as text on the command line (token counts with suffixes, size lists and ranges, a
price after `=`, comma-separated sizes) are range-checked where they are read: a value out of range is
refused in one line naming the option, its unit and its bounds, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from planner.bounds import MAX_MICRO_BATCH, MAX_SHARD_TOKENS
from planner.study import MAX_CLUSTER_GPUS, MAX_PRICE_PER_GPU_HOUR, MAX_TOKEN_BUDGET

runner = CliRunner()
WHATIF = ["whatif", "--model", "gpt2", "--seq-len", "1024", "--global-batch-tokens", "262144"]


def refusal(args: list[str]) -> str:
    """The one error line of a refused command (exit 2)."""
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, lines
    return lines[0]


@pytest.mark.parametrize(("args", "words"), [
    (["--tokens", "1e30", "--gpu", "H100"],
     f"--tokens: token count '1e30' is out of range: give 1 to {MAX_TOKEN_BUDGET:,} tokens"),
    (["--tokens", "0", "--gpu", "H100"],
     f"--tokens: token count '0' is out of range: give 1 to {MAX_TOKEN_BUDGET:,} tokens"),
    (["--tokens", "20000T", "--gpu", "H100"], "(10,000T)"),
    (["--tokens", "10B", "--gpu", "H100", "--sizes", "0,8"],
     f"--sizes: 0 is out of range: give 1 to {MAX_CLUSTER_GPUS:,} GPUs"),
    (["--tokens", "10B", "--gpu", "H100", "--sizes", "8-99999999"],
     f"--sizes: 99999999 is out of range: give 1 to {MAX_CLUSTER_GPUS:,} GPUs"),
    (["--tokens", "10B", "--gpu", "H100", "--sizes", "64-512:+0"], "--sizes: 0 is out of range"),
    (["--tokens", "10B", "--gpu", "H100", "--sizes", "9" * 5000], "--sizes: 99999999999999999999... is out"),
    (["--tokens", "10B", "--gpu", "H100=1e9"],
     f"--gpu 'H100=1e9': the price after '=' is out of range: give more than 0 and at most "
     f"{MAX_PRICE_PER_GPU_HOUR:,g} USD per GPU-hour"),
    (["--tokens", "10B", "--gpu", "H100=-2"], "--gpu 'H100=-2': the price after '=' is out of range"),
])
def test_whatif_refuses_numbers_out_of_range_naming_the_option_unit_and_bounds(
    args: list[str], words: str
) -> None:
    assert words in refusal([*WHATIF, *args])


@pytest.mark.parametrize(("typed", "words"), [
    ("0", f"--micro-batches: 0 is out of range: give 1 to {MAX_MICRO_BATCH:,} sequences each"),
    ("1,2,99999999", "--micro-batches: 99999999 is out of range"),
    ("1,x", "--micro-batches: 'x' is not a whole number in the digits 0-9"),
])
def test_calibrate_refuses_micro_batch_sizes_out_of_range(typed: str, words: str, tmp_path: Path) -> None:
    # Refused while the options are read: no bundle is written, no profiler started.
    line = refusal(["calibrate", "--micro-batches", typed, "--bundle", str(tmp_path / "b"), "--cluster",
                    "1x8xH100"])
    assert words in line and not (tmp_path / "b").exists()


def test_calibrate_reads_micro_batch_sizes_as_a_list(tmp_path: Path) -> None:
    result = runner.invoke(app, ["calibrate", "--micro-batches", " 1, 4", "--bundle", str(tmp_path),
                                 "--cluster", "1x8xH100"])
    assert result.exit_code == 0, result.output
    (script,) = tmp_path.glob("*/calibrate.sh")
    assert '--micro-batches "1,4"' in script.read_text()


@pytest.mark.parametrize(("typed", "words"), [
    ("0", f"--shard-tokens: 0 is out of range: give 1 to {MAX_SHARD_TOKENS:,} tokens"),
    ("5000G", "--shard-tokens: 5000G is out of range"),
    ("1e20", "--shard-tokens: '1e20' is not a count (e.g. 100M, 64k, 5000000); give 1 to"),
])
def test_prepare_data_refuses_shard_sizes_out_of_range(typed: str, words: str, tmp_path: Path) -> None:
    text = tmp_path / "in.txt"
    text.write_text("hello\n")
    line = refusal(["prepare-data", str(text), "-o", str(tmp_path / "out"), "--tokenizer", "bytes",
                    "--shard-tokens", typed])
    assert words in line and not (tmp_path / "out").exists()
