"""A tiny mixture-of-experts llama sharded over gloo ranks matches one process (issue 40): eager
FSDP2, and SimpleFSDP compiled with inductor (its grouped matmuls the per-expert custom operator) and with
aot_eager under whole-block checkpointing; the latent-attention model with a bias-balanced sigmoid
router also ends the step with the one process's router biases. Expert parallelism (ep 2: each rank
holds half the experts, tokens dispatched by all-to-all) on 2 ranks, eager and compiled (inductor,
bucketing the parameters' collectives), and on 4:
ep 2 x dp (the experts FSDP-sharded over the 2 ranks left after ep), with replicas (hybrid_shard), and
ep 2 x tp 2 (the experts split over tp too). One launch per world size (the compiled cases dominate:
each compiles its graphs once)."""

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
    "moe:full_shard:fsdp2:eager:none:ep2",
    "mla:full_shard:fsdp2:eager:full:ep2",
    # inductor with its collective bucketing: the dispatch's data-dependent sizes stay out of it.
    "moe:full_shard:simple_fsdp:inductor:none:ep2",
]
EP_CASES_4 = [
    "moe:full_shard:fsdp2:eager:none:ep2",
    "moe:hybrid_shard:simple_fsdp:eager:none:ep2",
    "moe:full_shard:fsdp2:eager:none:ep2tp2",
    "moe:full_shard:simple_fsdp:eager:none:ep2tp2",
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
    for case in ("mla:full_shard:fsdp2:eager:full", "mla:full_shard:simple_fsdp:aot_eager:full",
                 "mla:full_shard:fsdp2:eager:full:ep2"):
        assert records[case]["bias_updates"] == 1  # the one MoE block's router (block 0 is dense)
        assert any("2/2 blocks" in n for n in records[case]["notes"])
    assert any("expert parallel: ep=2" in n for n in records["moe:full_shard:fsdp2:eager:none:ep2"]["notes"])


def test_expert_parallel_on_four_ranks_matches_one_process(tmp_path: Path) -> None:
    out = tmp_path / "moe_parity_ep.json"
    result = torchrun(4, [WORKER, "--out", str(out), *EP_CASES_4], env=job_env(), timeout=600)
    assert result.returncode == 0, explain(result)
    records = {record["case"]: record for record in json.loads(out.read_text())}
    for case in EP_CASES_4:
        record = records[case]
        assert_matches_reference(record)
        assert record["compared"] > 20, record
    notes = {case: " ".join(records[case]["notes"]) for case in EP_CASES_4}
    assert records["moe:full_shard:fsdp2:eager:none:ep2"]["dp"] == 4
    assert "experts FSDP-sharded on mesh dp_shard_mod_ep=2" in notes["moe:full_shard:fsdp2:eager:none:ep2"]
    assert "expert_replicate=2 x dp_shard_mod_ep=1" in notes["moe:hybrid_shard:simple_fsdp:eager:none:ep2"]
    assert records["moe:full_shard:fsdp2:eager:none:ep2tp2"]["dp"] == 2
    assert "each split over tp 2" in notes["moe:full_shard:fsdp2:eager:none:ep2tp2"]
