"""Tensor parallelism with sequence and loss parallelism, composed with FSDP, on CPU (gloo) ranks.

Two torchrun launches:
  2 ranks  the vocabulary-parallel chunked loss against plain cross-entropy on full logits
  4 ranks  llama-debug (2 blocks) as dp 2 x tp 2 trains 4 AdamW steps like one process: eager FSDP2
           (plus a distributed checkpoint of the 2-D state, resumed under FSDP2 and SimpleFSDP),
           SimpleFSDP + inductor, and variants (replicas instead of shards, activation
           checkpointing with the loss in token slices, a head tied to the embedding), all in one
           launch

Tolerances (fp32 throughout): tensor parallelism changes only the order of floating-point sums
(row-parallel matmuls add tp partial products, the loss adds per-shard exp-sums, gradients are
reduce-scattered), so every value agrees with the one-process run to a few float32 roundings:
measured gradient errors are ~5e-7 relative, losses ~3e-6 after 4 AdamW steps. The bounds (1e-5 for
gradients, 2e-5 for losses) leave room for other CPUs' kernels yet sit orders of magnitude below
what a wrong layout gives (a tp shard missing from a sum or counted twice moves gradients by
tens of percent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.executor.conftest import REPO, explain, job_env, torchrun
from tests.executor.test_parity import NO_GRAPH_CACHE

pytestmark = pytest.mark.distributed

WORKERS = REPO / "tests" / "executor" / "workers"
GRAD_RTOL = 1e-5
LOSS_RTOL = 2e-5
CASES = [
    "full_shard:fsdp2:eager",  # also saves and resumes a checkpoint
    "full_shard:simple_fsdp:inductor:2",
    "no_shard:simple_fsdp:eager",
    "full_shard:fsdp2:eager:3:full",
    "full_shard:fsdp2:eager:1:none:tied",
]


def test_vocab_parallel_loss_matches_cross_entropy(tmp_path: Path) -> None:
    out = tmp_path / "loss.json"
    result = torchrun(2, [str(WORKERS / "vocab_parallel_loss.py"), "--out", str(out)], timeout=300)
    assert result.returncode == 0, explain(result)
    records = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"float32:1:eager", "float32:3:eager", "bfloat16:4:eager", "float32:3:aot_eager"}
    for case, r in records.items():
        # bf16: the reference rounds the logits' gradient to bf16 once, the slices round per slice.
        tol = 1e-2 if case.startswith("bfloat16") else 1e-5
        assert r["losses"][0] == r["losses"][1], f"{case}: the ranks of the group disagree on the loss"
        assert r["losses"][0] == pytest.approx(r["ref_loss"], rel=tol), case
        assert r["hidden_grad_err"] < tol and r["weight_grad_err"] < tol, r
        assert r["loss_dtype"] == "torch.float32"
        dtype = "torch." + case.split(":")[0]
        assert r["grad_dtypes"] == [dtype, dtype], r


@pytest.fixture(scope="module")
def dp2_tp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One 4-rank launch for every case (process start and the reference run paid once)."""
    tmp = tmp_path_factory.mktemp("tp")
    out = tmp / "tp.json"
    args = [str(WORKERS / "tensor_parallel.py"), "--out", str(out), "--checkpoint-dir", str(tmp / "ckpt")]
    result = torchrun(
        4, [*args, "--tp", "2", "--steps", "4", *CASES], env=job_env(**NO_GRAPH_CACHE), timeout=540
    )
    assert result.returncode == 0, explain(result)
    return {record["case"]: record for record in json.loads(out.read_text())}


def assert_trains_like_one_process(record: dict) -> None:
    bad = {name: err for name, err in record["grad_errors"].items() if not err < GRAD_RTOL}
    assert not bad, f"{record['case']}: step-1 gradients differ from the one-process run: {bad}"
    tied = record["case"].endswith(":tied")
    assert len(record["grad_errors"]) == 2 * 9 + 3 - tied  # every parameter was compared
    assert record["losses"] == pytest.approx(record["ref_losses"], rel=LOSS_RTOL), record["case"]
    assert record["ref_losses"][-1] < record["ref_losses"][0]  # it learns: the comparison means something
    assert "tensor parallel: tp=2 (sequence parallel, loss parallel)" in record["notes"]


def test_eager_fsdp2_dp2_tp2_trains_like_one_process(dp2_tp2: dict[str, dict]) -> None:
    record = dp2_tp2["full_shard:fsdp2:eager"]
    assert_trains_like_one_process(record)
    assert any("FSDP2 full_shard on mesh dp_shard=2" in n for n in record["notes"]), record["notes"]
    # tp innermost: ranks 0,1 form a tp group and read data-parallel shard 0; ranks 2,3 shard 1.
    assert record["dp"] == [[0, 2], [0, 2], [1, 2], [1, 2]]


def test_compiled_simple_fsdp_dp2_tp2_trains_like_one_process(dp2_tp2: dict[str, dict]) -> None:
    record = dp2_tp2["full_shard:simple_fsdp:inductor:2"]
    assert_trains_like_one_process(record)
    notes = record["notes"]
    assert any("SimpleFSDP full_shard on mesh dp_shard=2" in n for n in notes), notes
    assert any(n.startswith("torch.compile backend=inductor") for n in notes), notes
    assert any("in 2 token slice(s)" in n for n in notes), notes
    # The plan asks for async TP; on CPU it says it falls back and inductor is not asked to pipeline.
    assert any(n.startswith("async tensor parallel: not on cpu") for n in notes), notes
    assert not any("_micro_pipeline_tp" in n for n in notes), notes
    # What the generated code runs for one step of 2 blocks (forward + backward graph):
    # all-gathers: the parameters' over dp, one bucket, gathered again in backward (resharded) = 2;
    #   sequence gathers before attention and the MLP (2 per block) and before the head = 5, each
    #   once more in backward as the gradient of a reduce-scatter = 5.
    # all-reduces: the loss's max and sums, 2 per token slice = 4; the sequence-parallel norm
    #   weights' gradients over tp (2 per block + the final norm) = 5.
    # reduce-scatters: the embedding's and each block's two row-parallel outputs = 5, each once more
    #   in backward as the gradient of a sequence gather = 5, then the parameters' gradients over dp
    #   (bucketed; how many buckets inductor forms between the tp collectives is its choice).
    counts = record["collectives"]
    assert counts["all_gather_into_tensor"] == 12 and counts["all_reduce"] == 4 + 5, counts
    assert counts["reduce_scatter_tensor"] > 10, counts


def test_tensor_parallel_variants(dp2_tp2: dict[str, dict]) -> None:
    replicas = dp2_tp2["no_shard:simple_fsdp:eager"]
    assert_trains_like_one_process(replicas)
    assert any("SimpleFSDP no_shard on mesh dp_replicate=2" in n for n in replicas["notes"])
    assert replicas["dp"] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    recomputed = dp2_tp2["full_shard:fsdp2:eager:3:full"]
    assert_trains_like_one_process(recomputed)
    assert any("full (2/2 blocks)" in n for n in recomputed["notes"]), recomputed["notes"]
    # A head tied to the embedding: both split by vocabulary rows, one DTensor for both.
    assert_trains_like_one_process(dp2_tp2["full_shard:fsdp2:eager:1:none:tied"])


def test_checkpoint_of_the_2d_state_resumes_to_the_same_loss(dp2_tp2: dict[str, dict]) -> None:
    record = dp2_tp2["full_shard:fsdp2:eager"]
    last = record["losses"][-1]
    resumed = record["resumed_last_loss"]
    # The same engine continues bit for bit; SimpleFSDP reads FSDP2's shards of the same DTensors.
    assert resumed["fsdp2"] == last
    assert resumed["simple_fsdp"] == pytest.approx(last, rel=1e-6)
    # One process reads the whole tensors back from the (_StridedShard) shards and continues as the
    # one-process run would: only the reduction order differs.
    assert resumed["unsharded"] == pytest.approx(last, rel=LOSS_RTOL)
