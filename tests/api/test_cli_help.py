"""The command line's help matches its options, and its refusals read as the command line speaks.

Every command's options are walked: a flag's help shows no value type, a number option's parser holds
its unit and bounds and its help states them. Refusals go through the real entry point (CliRunner on
the app, and the installed console script where the terminal's output matters): one line, naming the
option typed, never an API field; the exit codes are declared once and shown in `--help` and the docs.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.core import TyperOption
from typer.testing import CliRunner

from api.cli.commands import COMMANDS, load_command
from api.cli.common import DecimalNumber, NetworkBandwidth, WholeNumber
from api.cli.exit_codes import EXIT_CODES, markdown_table
from api.cli.main import app
from tests.planner.test_specs import HF_LLAMA3

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
WIDE = {"COLUMNS": "400"}
"""Help rows unwrapped, so that an option's row holds all its help."""


def every_command() -> Iterator[tuple[str, object]]:
    """(`plan`, command), (`db upgrade`, command), ... for every command the root lists."""
    def walk(path: str, command: object) -> Iterator[tuple[str, object]]:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                yield from walk(f"{path} {name}", sub)
        else:
            yield path, command

    for entry in COMMANDS:
        yield from walk(entry.name, load_command(entry))


COMMAND_PATHS = sorted(path for path, _ in every_command())


def every_group() -> Iterator[str]:
    """`` (the root), `db`, `keys`, ...: every path whose `--help` lists commands rather than options."""
    def walk(path: str, command: object) -> Iterator[str]:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            yield path
            for name, sub in subcommands.items():
                yield from walk(f"{path} {name}", sub)

    yield ""
    for entry in COMMANDS:
        yield from walk(entry.name, load_command(entry))


GROUP_PATHS = sorted(every_group())


def help_text(path: str) -> str:
    result = runner.invoke(app, [*path.split(), "--help"], prog_name="fsdp-planner", env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def options(command: object) -> list[TyperOption]:
    return [p for p in command.params if isinstance(p, TyperOption)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", GROUP_PATHS + COMMAND_PATHS)
def test_flags_show_no_value_type(path: str) -> None:
    """Every command's `--help`, and every group's (the root, `db`, `keys`): `--help` itself is a flag."""
    text = help_text(path)
    assert "--help" in text, text
    assert "<bool>" not in text, text


def test_every_command_has_a_flag_and_a_number_walked() -> None:
    """The walk reaches the commands' options and the groups (a test over nothing would pass)."""
    commands = dict(every_command())
    assert {"--async-tp", "--verbose"} <= {o.opts[0] for o in options(commands["plan"]) if o.is_flag}
    assert len(commands) >= 17
    assert {"", "db", "keys"} <= set(GROUP_PATHS)


@pytest.mark.parametrize("path", COMMAND_PATHS)
def test_every_number_option_states_its_unit_and_bounds(path: str) -> None:
    command = dict(every_command())[path]
    text = " ".join(help_text(path).split())
    for option in options(command):
        if option.is_flag or option.type_descriptor.annotation not in (int, float):
            continue
        parser = option.type_descriptor.parameter_info.parser
        assert isinstance(parser, WholeNumber | DecimalNumber | NetworkBandwidth), (
            f"{path} {option.opts}: no bounded parser"
        )
        assert parser.unit, f"{path} {option.opts}: no unit"
        assert parser.describe() in text, f"{path} {option.opts}: help does not state {parser.describe()!r}"


def test_bounds_come_from_where_they_are_declared() -> None:
    from planner.bounds import MAX_GLOBAL_BATCH_TOKENS, MAX_SEQ_LEN
    from planner.specs import PlanRequest

    plan = " ".join(help_text("plan").split())
    assert f"Range: 1 to {MAX_SEQ_LEN:,} tokens" in plan
    assert f"Range: 1 to {MAX_GLOBAL_BATCH_TOKENS:,} tokens" in plan
    top = PlanRequest.model_fields["top_k"].metadata
    assert f"Range: {top[0].ge} to {top[1].le} configurations" in plan


def plan_args(*extra: str) -> list[str]:
    return ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--global-batch-tokens", "1048576",
            *extra]


def test_a_sequence_length_takes_k() -> None:
    result = runner.invoke(app, plan_args("--seq-len", "8k", "--json"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["training"]["seq_len"] == 8192


def console_script(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed `fsdp-planner`, as a person runs it (stderr as a terminal would show it)."""
    executable = shutil.which("fsdp-planner", path=str(Path(sys.executable).parent)) or "fsdp-planner"
    return subprocess.run([executable, *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": str(Path(sys.executable).parent), "COLUMNS": "100"}, cwd=ROOT)


@pytest.mark.parametrize(("args", "says"), [
    (plan_args("--seq-len", "8x"), "error: --seq-len: '8x' is not a whole number"),
    (plan_args("--top", "500"), "error: --top: 500 is out of range: give 1 to 50 configurations"),
    (plan_args("--sequence-length", "8192"), "error: No such option: --sequence-length"),
    (["pln"], "error: No such command 'pln'. Did you mean 'plan'"),
])
def test_a_bad_option_is_refused_in_one_line(args: list[str], says: str) -> None:
    done = console_script(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), done.stderr
    assert "--help" in lines[0] and "Usage:" not in done.stderr and "╭" not in done.stderr


@pytest.mark.parametrize(("cluster", "says"), [
    ("1x8xRTX4090", "--cluster 1x8xRTX4090: unknown GPU 'RTX4090'; known GPUs:"),
    ("1x8xH10", "--cluster 1x8xH10: unknown GPU 'H10' (did you mean 'H100'?); known GPUs:"),
    ("8 H100", "--cluster 8 H100: cannot read '8 H100' as a cluster"),
])
def test_a_cluster_refusal_names_the_option(cluster: str, says: str) -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", cluster,
                                 "--global-batch-tokens", "1048576"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and says in text, text
    assert "cluster.gpu" not in text and "cluster:" not in text


def test_a_whatif_gpu_refusal_names_the_option() -> None:
    result = runner.invoke(app, ["whatif", "--model", "llama3-8b", "--tokens", "1T", "--gpu", "H10",
                                 "--sizes", "8", "--global-batch-tokens", "1048576"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "--gpu H10: unknown GPU 'H10' (did you mean 'H100'?)" in text, text
    assert "gpus.0" not in text


def test_a_mistyped_model_gets_a_suggestion() -> None:
    result = runner.invoke(app, ["plan", "--model", "lama3-8b", "--cluster", "1x8xH100",
                                 "--global-batch-tokens", "1048576"])
    assert result.exit_code == 2
    assert "unknown model 'lama3-8b' (did you mean 'llama3-8b'?)" in " ".join(result.output.split())


def test_a_config_missing_a_field_says_it_is_missing(tmp_path: Path) -> None:
    config = {key: value for key, value in HF_LLAMA3.items() if key != "num_hidden_layers"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = runner.invoke(app, ["plan", "--hf-config", str(path), "--cluster", "1x8xH100",
                                 "--global-batch-tokens", "1048576"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "config.json: `num_hidden_layers` is missing" in text and "None" not in text


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_without_a_scheme_is_read_as_http() -> None:
    port = closed_port()
    result = runner.invoke(app, ["validate", "--plan-id", "1", "--server", f"127.0.0.1:{port}"])
    text = " ".join(result.output.split())
    assert result.exit_code == 4, text
    assert f"cannot reach the fsdp-planner server at http://127.0.0.1:{port}" in text
    assert "UnsupportedProtocol" not in text


def test_a_server_of_another_scheme_is_refused() -> None:
    result = runner.invoke(app, ["validate", "--plan-id", "1", "--server", "ftp://example.org"])
    assert result.exit_code == 2
    assert "--server ftp://example.org: not a server URL; give http://HOST:PORT" in " ".join(
        result.output.split())


def test_every_exit_code_is_in_the_root_help() -> None:
    text = " ".join(runner.invoke(app, ["--help"], prog_name="fsdp-planner", env=WIDE).output.split())
    assert "Exit codes:" in text
    for entry in EXIT_CODES:
        assert f"{entry.code} {entry.meaning}:" in text


def test_the_docs_show_the_exit_codes_of_the_code() -> None:
    """docs/cli.md's table is the one `python -m api.cli.exit_codes` prints."""
    assert markdown_table() in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    codes = [entry.code for entry in EXIT_CODES]
    assert codes == sorted(set(codes))


def advised_options(message: str) -> list[str]:
    """The options a refusal's last advice names (`... it plans on 120 GPUs: --cluster 15x8xH100 --cp 2
    --tp 4 --global-batch-tokens 122880 (...)`), as a person would type them."""
    tail = message.rsplit("it plans on ", 1)[1]
    return tail.split(": ", 1)[1].split(" (", 1)[0].replace(",", "").split()


def test_advice_for_a_model_one_gpu_cannot_hold_leads_to_a_plan() -> None:
    """405B on one GPU per node: naming `--cp` alone is not advice (one GPU cannot split a sequence
    over 8); the refusal names the cluster and degrees on which it plans, and they plan."""
    request = ["plan", "--model", "llama3.1-405b", "--seq-len", "8192"]
    refused = runner.invoke(app, [*request, "--cluster", "1x1xH100", "--global-batch-tokens", "65536"])
    text = " ".join(refused.output.split())
    assert refused.exit_code == 3, text
    options = advised_options(text)
    assert "--cluster" in options and "--cp" in options, text
    followed = runner.invoke(app, [*request, *options, "--json"])
    assert followed.exit_code == 0, " ".join(followed.output.split())
    assert json.loads(followed.stdout)["config"]["mesh"]["cp"] > 1


def test_a_degree_larger_than_the_cluster_says_so() -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3.1-405b", "--seq-len", "8192", "--cluster",
                                 "1x1xH100", "--global-batch-tokens", "65536", "--cp", "8"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "--cp: cp=8 needs 8 GPUs (context-parallel ranks), and 1x1xH100-SXM-80GB has 1" in text
    assert "cannot be split evenly" not in text
