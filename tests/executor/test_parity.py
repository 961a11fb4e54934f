"""Numerical parity: every sharding mode, eager and compiled, against a single-process reference.

Two torchrun launches (cases batched to pay process start-up and the reference run once):
  2 ranks           eager: FSDP2 and eager SimpleFSDP, each mode, with activation-checkpointing
                    variants, bf16 and the loss in token slices; compiled: SimpleFSDP + inductor
                    (bucketed, reordered) for full_shard (loss in token slices), shard_grad_op,
                    no_shard; compiled activation checkpointing (full, every k-th block, op-level)
  4 ranks 2x2       hybrid_shard: FSDP2 (HSDP), eager SimpleFSDP, SimpleFSDP + inductor
Compiled cases also count the collectives inductor generated, which pins down what each mode
means (full_shard re-gathers in backward, shard_grad_op keeps the gathered weights, no_shard only
all-reduces) and that bucketing merged the per-parameter collectives into one call per bucket.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.executor.conftest import REPO, explain, job_env, torchrun

pytestmark = pytest.mark.distributed

WORKER = str(REPO / "tests" / "executor" / "workers" / "parity.py")
# Generated code is read back from the compilation itself, so caches that skip it must be off
# (the C++ kernel cache stays on).
NO_GRAPH_CACHE = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


def run_cases(tmp_path: Path, nproc: int, cases: list[str], *, timeout: float = 420) -> dict[str, dict]:
    """One launch of `nproc` ranks running `cases`; their records by case."""
    out = tmp_path / "parity.json"
    result = torchrun(
        nproc, [WORKER, "--out", str(out), *cases], env=job_env(**NO_GRAPH_CACHE), timeout=timeout
    )
    assert result.returncode == 0, explain(result)
    return {record["case"]: record for record in json.loads(out.read_text())}


def assert_matches_reference(record: dict) -> None:
    assert record["failures"] == [], f"{record['case']}: gradients differ from the reference: {record}"
    assert record["loss"] == pytest.approx(
        record["ref_loss"], rel=1e-5 if "bf16" not in record["case"] else 1e-2
    )


EAGER_CASES = [
    "full_shard:fsdp2:eager",
    "shard_grad_op:fsdp2:eager",
    "no_shard:fsdp2:eager",
    # Accumulation: replicas all-reduce once after the last micro-batch, shards every micro-batch.
    "no_shard:fsdp2:eager:none:fp32:2",
    "full_shard:fsdp2:eager:none:fp32:2",
    "full_shard:simple_fsdp:eager",
    "shard_grad_op:simple_fsdp:eager",
    "no_shard:simple_fsdp:eager",
    "full_shard:fsdp2:eager:selective",
    "full_shard:fsdp2:eager:full",
    "full_shard:simple_fsdp:eager:op_selective",
    "shard_grad_op:simple_fsdp:eager:full",
    "full_shard:fsdp2:eager:none:bf16",
    "full_shard:simple_fsdp:eager:none:bf16",
    # The loss in 3 token slices (128 tokens per rank: uneven slices) through both engines' head.
    "full_shard:fsdp2:eager:none:fp32:1:3",
    "shard_grad_op:simple_fsdp:eager:none:bf16:1:3",
    # Pure bf16 training (training.state_dtype bfloat16: bf16 parameters, gradients and their
    # reduction, no fp32 master) with the first of the 2 blocks checkpointed (mode `blocks`), in
    # both engines.
    "full_shard:fsdp2:eager:first1:bf16pure",
    "shard_grad_op:simple_fsdp:eager:first1:bf16pure",
    "full_shard:fsdp2:eager:first1",  # the same checkpointing in fp32: exact
]


COMPILED_CASES = [
    # The loss in 3 token slices: the chunked loss compiles into the model's one graph.
    "full_shard:simple_fsdp:inductor:none:fp32:1:3",
    "shard_grad_op:simple_fsdp:inductor",
    "no_shard:simple_fsdp:inductor",
    # Activation checkpointing under compile (aot_eager: the same AOTAutograd partitioning and
    # runtime as inductor, without code generation): whole blocks, every k-th block, op-level.
    "full_shard:simple_fsdp:aot_eager:full",
    "full_shard:simple_fsdp:aot_eager:selective",
    "shard_grad_op:simple_fsdp:aot_eager:op_selective",
]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The eager and the compiled 2-rank cases in one launch (process start and reference paid once)."""
    return run_cases(tmp_path_factory.mktemp("parity2"), 2, EAGER_CASES + COMPILED_CASES)


def test_eager_modes_match_reference(two_ranks: dict[str, dict]) -> None:
    records = two_ranks
    for case in EAGER_CASES:
        assert_matches_reference(records[case])
    # bf16 is really bf16 (not silently fp32), and both engines cast the same way.
    bf16 = [records["full_shard:fsdp2:eager:none:bf16"], records["full_shard:simple_fsdp:eager:none:bf16"]]
    assert all(r["max_rel_err"] > 1e-4 for r in bf16)
    assert bf16[0]["max_rel_err"] == pytest.approx(bf16[1]["max_rel_err"], rel=1e-3)
    assert any("2/2 blocks" in n for n in records["full_shard:fsdp2:eager:full"]["notes"])
    assert any("1/2 blocks" in n for n in records["full_shard:fsdp2:eager:selective"]["notes"])
    for case in ("full_shard:fsdp2:eager:none:fp32:1:3", "shard_grad_op:simple_fsdp:eager:none:bf16:1:3"):
        assert any("in 3 token slice(s)" in n for n in records[case]["notes"]), records[case]["notes"]
    # Pure bf16 keeps no fp32 master (the worker checks the gradients are bf16); the first block of
    # two is checkpointed.
    for case in ("full_shard:fsdp2:eager:first1:bf16pure", "shard_grad_op:simple_fsdp:eager:first1:bf16pure"):
        notes = records[case]["notes"]
        assert any(n.startswith("pure bf16") for n in notes), notes
        assert any("blocks (1/2 blocks)" in n for n in notes), notes
        assert records[case]["max_rel_err"] > 1e-4  # bf16 arithmetic, not fp32 in disguise


def test_compiled_modes_match_reference(two_ranks: dict[str, dict]) -> None:
    records = two_ranks
    cases = COMPILED_CASES
    for case in cases:
        assert_matches_reference(records[case])
    chunked = records["full_shard:simple_fsdp:inductor:none:fp32:1:3"]
    assert any("in 3 token slice(s)" in n for n in chunked["notes"]), chunked["notes"]
    # One bucket holds every parameter (cap 64 MB > 4 MB model): one all-gather per graph.
    # full_shard re-gathers in backward (resharded after forward); shard_grad_op does not.
    assert chunked["collectives"] == {
        "all_gather_into_tensor": 2,
        "reduce_scatter_tensor": 1,
    }
    assert records["shard_grad_op:simple_fsdp:inductor"]["collectives"] == {
        "all_gather_into_tensor": 1,
        "reduce_scatter_tensor": 1,
    }
    assert records["no_shard:simple_fsdp:inductor"]["collectives"] == {"all_reduce": 1}


def test_hybrid_shard_on_2x2_mesh_matches_reference(tmp_path: Path) -> None:
    cases = [
        "hybrid_shard:fsdp2:eager",
        "hybrid_shard:simple_fsdp:eager",
        "hybrid_shard:simple_fsdp:inductor",
    ]
    records = run_cases(tmp_path, 4, cases)
    for case in cases:
        assert_matches_reference(records[case])
        assert any("dp_replicate=2 x dp_shard=2" in n for n in records[case]["notes"]), records[case]["notes"]
    # Gather within the shard group; gradients reduce-scattered there, then all-reduced over replicas.
    assert records["hybrid_shard:simple_fsdp:inductor"]["collectives"] == {
        "all_gather_into_tensor": 2,
        "reduce_scatter_tensor": 1,
        "all_reduce": 1,
    }
