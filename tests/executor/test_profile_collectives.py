"""The profiler measures collectives at every tensor-parallel group size the machine has (issue 13):
the whole world, the whole node, and every power-of-two node-local group of consecutive ranks."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from executor.profile.run import collective_groups
from planner.calibration import CalibrationProfile
from tests.executor.conftest import explain, torchrun


@pytest.mark.parametrize(
    ("world", "local_world", "expected"),
    [
        (1, 1, []),
        (2, 2, [(2, "intra")]),
        # One node: the world is the node, measured once.
        (4, 4, [(4, "intra"), (2, "intra")]),
        (8, 8, [(8, "intra"), (4, "intra"), (2, "intra")]),
        # Several nodes: the world over the network, then the node and its TP groups.
        (16, 8, [(16, "inter"), (8, "intra"), (4, "intra"), (2, "intra")]),
        (16, 2, [(16, "inter"), (2, "intra")]),
        # Six GPUs per node: the node itself, and the only power of two that divides it.
        (12, 6, [(12, "inter"), (6, "intra"), (2, "intra")]),
        # One GPU per node: no node-local group to measure.
        (4, 1, [(4, "inter")]),
        # Nodes of unequal size cannot be split into equal node-local groups.
        (10, 4, [(10, "inter")]),
    ],
)
def test_measured_groups(world: int, local_world: int, expected: list[tuple[int, str]]) -> None:
    assert collective_groups(world, local_world) == expected


@pytest.mark.distributed
def test_four_cpu_ranks_measure_groups_of_two_and_four(tmp_path: Path) -> None:
    output = tmp_path / "profile.json"
    # No model, a one-second budget and messages of at most 10 KiB (1 and 4 KiB): a few seconds.
    result = torchrun(
        4,
        ["-m", "executor.profile.run", "-o", str(output), "--budget-s", "1", "--max-message-mib", "0.01"],
        timeout=180,
    )
    assert result.returncode == 0, explain(result)
    profile = CalibrationProfile.model_validate_json(output.read_text())
    assert profile.fingerprint.device_count == 4 and profile.fingerprint.gpus_per_node == 4
    ops: dict[tuple[int, str], set[str]] = defaultdict(set)
    for sample in profile.collectives:
        ops[(sample.group_size, sample.link)].add(sample.op)
        assert sample.bytes <= 10 * 1024
    # Pairs of ranks (TP 2) and the whole node (TP 4, here also the world), each measured once, and
    # every op at each: the world is not measured a second time as a node-local group.
    assert dict(ops) == {
        (4, "intra"): {"all_gather", "reduce_scatter", "all_reduce"},
        (2, "intra"): {"all_gather", "reduce_scatter", "all_reduce"},
    }
    sweeps = [(s.group_size, s.op, s.bytes) for s in profile.collectives]
    assert len(sweeps) == len(set(sweeps))
