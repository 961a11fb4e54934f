"""A tiny mixture-of-experts llama sharded over 2 gloo ranks matches one process (issue 40): eager
FSDP2, and SimpleFSDP compiled with inductor (its grouped matmuls the per-expert custom operator) and with
aot_eager under whole-block checkpointing; the latent-attention model with a bias-balanced sigmoid
router also ends the step with the one process's router biases. One launch (the compiled cases
dominate: each compiles its graphs once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.executor.conftest import REPO, explain, job_env, torchrun
from tests.executor.test_parity import NO_GRAPH_CACHE, assert_matches_reference

pytestmark = pytest.mark.distributed

WORKER = str(REPO / "tests" / "executor" / "workers" / "moe_parity.py")
CASES = [
    "moe:full_shard:fsdp2:eager",
    "mla:full_shard:fsdp2:eager:full",
    "moe:full_shard:simple_fsdp:inductor",
    "mla:full_shard:simple_fsdp:aot_eager:full",
]


def test_moe_models_match_one_process(tmp_path: Path) -> None:
    out = tmp_path / "moe_parity.json"
    result = torchrun(2, [WORKER, "--out", str(out), *CASES], env=job_env(**NO_GRAPH_CACHE), timeout=900)
    assert result.returncode == 0, explain(result)
    records = {record["case"]: record for record in json.loads(out.read_text())}
    for case in CASES:
        record = records[case]
        assert_matches_reference(record)
        assert record["compared"] > 20, record  # every parameter's gradient, experts' included
    for case in ("mla:full_shard:fsdp2:eager:full", "mla:full_shard:simple_fsdp:aot_eager:full"):
        assert records[case]["bias_updates"] == 1  # the one MoE block's router (block 0 is dense)
        assert any("2/2 blocks" in n for n in records[case]["notes"])
