"""Context parallelism: the load-balanced split and the causal mask in one process, then cp2 and
dp2 x cp2 / cp2 x tp2 training on CPU (gloo) ranks against a one-process run.

Three torchrun launches (`workers/context_parallel.py`, every case of a world size in one launch):
  2 ranks  cp 2: eager FSDP2 (with a checkpoint saved and resumed under FSDP2, SimpleFSDP and in
           one process), eager SimpleFSDP, full and op-level selective activation checkpointing
           with the loss in token slices, no_shard (the cp ranks as replicas), SimpleFSDP + inductor
Every eager case also compares the untrained model's logits (a forward without targets: gathered
over the cp group in position order) with the one-process model's.
  4 ranks  dp 2 x cp 2 under FSDP2 and SimpleFSDP (full_shard: shards over dp_shard x cp), as
           no_shard (SimpleFSDP: 4 replicas); and cp 2 x tp 2 under FSDP2 and SimpleFSDP
  8 ranks  hybrid_shard: 2 replicas of a dp_shard 2 x cp 2 shard group, FSDP2 and SimpleFSDP (the
           plan check wants dp_shard and dp_replicate >= 2, so 8 ranks; ~35 s on 2 cores)

Tolerances (fp32): context parallelism changes the order of floating-point sums only (attention per
query chunk under a lower-right causal mask instead of one causal kernel call, the K/V gradients
reduce-scattered, gradients averaged over the cp ranks), so the bounds are
tensor parallelism's (`test_tensor_parallel.py`): 1e-5 for step-1 gradients, 2e-5 for the losses of
4 AdamW steps. A rank attending the wrong keys, a chunk at the wrong position or a gradient
counted twice moves them by percents.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

from contract.plan_document import PlanError, parse_plan
from executor.runtime.context_parallel import (
    apply_context_parallel,
    attend_local_queries,
    in_position_order,
    load_balanced_chunks,
    local_positions,
    lower_right_biases,
    lower_right_causal_mask,
    split_sequence,
)
from executor.runtime.models.common import sdpa_causal
from executor.runtime.models.llama import RotaryEmbedding
from tests.executor.conftest import REPO, explain, job_env, torchrun
from tests.executor.plan_factory import debug_plan
from tests.executor.test_parity import NO_GRAPH_CACHE

WORKERS = REPO / "tests" / "executor" / "workers"
GRAD_RTOL = 1e-5
LOSS_RTOL = 2e-5
CP2_CASES = [
    "2,1:full_shard:fsdp2:eager",  # also saves and resumes a checkpoint
    "2,1:full_shard:simple_fsdp:eager",
    "2,1:full_shard:fsdp2:eager:3:full",
    "2,1:full_shard:simple_fsdp:eager:2:op_selective",
    "2,1:no_shard:fsdp2:eager",
    "2,1:full_shard:simple_fsdp:inductor:2",
]
FOUR_RANK_CASES = [
    "2,1:full_shard:fsdp2:eager",
    "2,1:full_shard:simple_fsdp:eager",
    "2,1:no_shard:simple_fsdp:eager",
    "2,2:full_shard:fsdp2:eager",
    "2,2:full_shard:simple_fsdp:eager",
]


# ---- the split and the mask, in one process ----


def test_rank_i_holds_chunks_i_and_its_mirror() -> None:
    assert [load_balanced_chunks(2, r) for r in range(2)] == [(0, 3), (1, 2)]
    assert [load_balanced_chunks(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert local_positions(8, cp=2, rank=0).tolist() == [0, 1, 6, 7]
    assert local_positions(8, cp=2, rank=1).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="2 x cp 2"):
        local_positions(6, cp=2, rank=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        split_sequence(torch.zeros(1, 6), cp=2, rank=0)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_the_split_covers_the_sequence_once_and_balances_the_causal_work(cp: int) -> None:
    seq = 2 * cp * 5
    tokens = torch.arange(seq).unsqueeze(0)
    pieces = [split_sequence(tokens, cp=cp, rank=r) for r in range(cp)]
    for r, piece in enumerate(pieces):
        assert piece[0].tolist() == local_positions(seq, cp=cp, rank=r).tolist()
    assert sorted(torch.cat(pieces, dim=1)[0].tolist()) == list(range(seq))
    # Query at position p attends p + 1 keys: every rank gets the same number of (query, key) pairs.
    work = [int((local_positions(seq, cp=cp, rank=r) + 1).sum()) for r in range(cp)]
    assert len(set(work)) == 1 and sum(work) == seq * (seq + 1) // 2


def test_a_chunk_attends_every_key_before_it_and_its_own_causally() -> None:
    """A chunk of queries that ends the keys: query i sees keys 0 .. i + (k_len - q_len), as an
    explicit mask (compiled) and as torch's lower-right causal bias (eager) alike."""
    torch.manual_seed(0)
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 7, 8, dtype=torch.float64) for _ in range(2))
    mask = torch.tensor([[j <= i + 4 for j in range(7)] for i in range(3)])
    assert torch.equal(lower_right_causal_mask(3, 7), mask)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(sdpa_causal(q, k, v, mask=lower_right_causal_mask(3, 7)), expected)
    first, second = lower_right_biases(12, cp=2, rank=1)  # chunks 1 and 2 of 4 chunks of 3 tokens
    assert [(b.seq_len_q, b.seq_len_kv) for b in (first, second)] == [(3, 6), (3, 9)]
    torch.testing.assert_close(sdpa_causal(q, k, v, mask=causal_lower_right(3, 7)), expected)


@pytest.mark.parametrize(("cp", "heads", "kv_heads"), [(2, 4, 4), (2, 4, 2), (3, 2, 1)])
def test_local_queries_over_gathered_keys_give_the_full_causal_attention(
    cp: int, heads: int, kv_heads: int
) -> None:
    """What each cp rank computes (rope at global positions; the ranks' keys and values gathered,
    put in position order; its chunks' queries against them) is its rows of the one-process
    attention, gradients included."""
    torch.manual_seed(0)
    seq, dim = 2 * cp * 3, 8
    rope = RotaryEmbedding(dim, max_len=seq, theta=10000.0).to(torch.float64)
    q = torch.randn(2, heads, seq, dim, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, seq, dim, dtype=torch.float64, requires_grad=True) for _ in range(2))
    full = sdpa_causal(rope(q), rope(k), v)
    (full * full).sum().backward()
    ref_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None

    def local(x: torch.Tensor, r: int) -> torch.Tensor:
        return split_sequence(x, cp=cp, rank=r, dim=2)

    gathered = torch.cat([
        torch.stack([rope(local(k, r), local_positions(seq, cp=cp, rank=r)), local(v, r)]) for r in range(cp)
    ], dim=3)
    keys, values = in_position_order(gathered, cp=cp, dim=3).unbind(0)
    total = torch.zeros((), dtype=torch.float64)
    for r in range(cp):
        queries = rope(local(q, r), local_positions(seq, cp=cp, rank=r))
        out = attend_local_queries(queries, keys, values, cp=cp, rank=r)  # explicit masks
        biased = attend_local_queries(
            queries, keys, values, cp=cp, rank=r, biases=lower_right_biases(seq, cp=cp, rank=r)
        )
        # Biases made for another sequence length are not used: explicit masks of this one.
        other = lower_right_biases(2 * seq, cp=cp, rank=r)
        stale = attend_local_queries(queries, keys, values, cp=cp, rank=r, biases=other)
        torch.testing.assert_close(out, local(full, r))
        torch.testing.assert_close(biased, out)
        torch.testing.assert_close(stale, out)
        total = total + (out * out).sum()
    total.backward()
    for t, ref in zip((q, k, v), ref_grads, strict=True):
        torch.testing.assert_close(t.grad, ref)


def test_gathered_pieces_return_to_position_order() -> None:
    # ContextShard.gather and the K/V gather: the all-gather's rank order put back in positions.
    x = torch.randn(2, 12, 3)
    gathered = torch.cat([split_sequence(x, cp=3, rank=r) for r in range(3)], dim=1)
    assert torch.equal(in_position_order(gathered, cp=3, dim=1), x)


def test_context_parallelism_refuses_other_models() -> None:
    # A --model-factory model under a llama plan: refused before any process group is touched.
    plan = parse_plan(debug_plan(gpus_per_node=2, cp=2))
    with pytest.raises(PlanError, match="built-in llama model only, this model is a Linear"):
        apply_context_parallel(torch.nn.Linear(2, 2), plan=plan, mesh=None)  # type: ignore[arg-type]


# ---- training on gloo ranks against one process ----


def _launch(tmp: Path, world: int, cases: list[str]) -> dict[str, dict]:
    out = tmp / "cp.json"
    args = [str(WORKERS / "context_parallel.py"), "--out", str(out), "--checkpoint-dir", str(tmp / "ckpt")]
    result = torchrun(world, [*args, "--steps", "4", *cases], env=job_env(**NO_GRAPH_CACHE), timeout=540)
    assert result.returncode == 0, explain(result)
    return {record["case"]: record for record in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def cp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _launch(tmp_path_factory.mktemp("cp2"), 2, CP2_CASES)


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    cases = ["2,1:hybrid_shard:fsdp2:eager", "2,1:hybrid_shard:simple_fsdp:eager"]
    return _launch(tmp_path_factory.mktemp("cp8"), 8, cases)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _launch(tmp_path_factory.mktemp("cp4"), 4, FOUR_RANK_CASES)


def assert_trains_like_one_process(record: dict) -> None:
    bad = {name: err for name, err in record["grad_errors"].items() if not err < GRAD_RTOL}
    assert not bad, f"{record['case']}: step-1 gradients differ from the one-process run: {bad}"
    assert len(record["grad_errors"]) == 2 * 9 + 3  # every parameter was compared
    assert record["losses"] == pytest.approx(record["ref_losses"], rel=LOSS_RTOL), record["case"]
    assert record["ref_losses"][-1] < record["ref_losses"][0]  # it learns: the comparison means something
    assert any(n.startswith("context parallel: cp=2 (32 tokens") for n in record["notes"]), record["notes"]
    if record["logits_err"] is not None:  # eager: logits without targets, gathered in order
        assert record["logits_err"] < GRAD_RTOL, record["case"]


@pytest.mark.distributed
def test_cp2_trains_like_one_process(cp2: dict[str, dict]) -> None:
    fsdp2 = cp2["2,1:full_shard:fsdp2:eager"]
    assert_trains_like_one_process(fsdp2)
    assert any("FSDP2 full_shard on mesh dp_shard_cp=2" in n for n in fsdp2["notes"]), fsdp2["notes"]
    # Both cp ranks read the same sequences: one data-parallel rank.
    assert fsdp2["dp"] == [[0, 1], [0, 1]]
    simple = cp2["2,1:full_shard:simple_fsdp:eager"]
    assert_trains_like_one_process(simple)
    assert any("SimpleFSDP full_shard on mesh dp_shard_cp=2" in n for n in simple["notes"]), simple["notes"]
    recomputed = cp2["2,1:full_shard:fsdp2:eager:3:full"]
    assert_trains_like_one_process(recomputed)
    assert any("full (2/2 blocks)" in n for n in recomputed["notes"]), recomputed["notes"]
    selective = cp2["2,1:full_shard:simple_fsdp:eager:2:op_selective"]
    assert_trains_like_one_process(selective)
    assert any("op_selective (2/2 blocks)" in n for n in selective["notes"]), selective["notes"]
    replicas = cp2["2,1:no_shard:fsdp2:eager"]
    assert_trains_like_one_process(replicas)
    assert any("FSDP2 no_shard on mesh dp_replicate_cp=2 x no_shard=1" in n for n in replicas["notes"])


@pytest.mark.distributed
def test_compiled_simple_fsdp_cp2_trains_like_one_process(cp2: dict[str, dict]) -> None:
    record = cp2["2,1:full_shard:simple_fsdp:inductor:2"]
    assert_trains_like_one_process(record)
    assert any(n.startswith("torch.compile backend=inductor") for n in record["notes"]), record["notes"]
    # What the generated code runs for one step of 2 blocks (forward + backward graph):
    # all-gathers: K and V stacked, once per block = 2; the parameters' (one bucket), gathered again
    #   in backward (resharded) = 2. all-reduces: the loss's cp-group mean = 1 (detached: none in
    #   backward). reduce-scatters: the K/V gradients, once per block = 2, then the parameters'
    #   gradients over dp_shard x cp (bucketed; how many buckets is inductor's choice).
    counts = record["collectives"]
    assert counts["all_gather_into_tensor"] == 4 and counts["all_reduce"] == 1, counts
    assert counts["reduce_scatter_tensor"] >= 3, counts


@pytest.mark.distributed
def test_cp2_checkpoint_resumes_to_the_same_loss(cp2: dict[str, dict]) -> None:
    record = cp2["2,1:full_shard:fsdp2:eager"]
    last = record["losses"][-1]
    resumed = record["resumed_last_loss"]
    assert resumed["fsdp2"] == last
    assert resumed["simple_fsdp"] == pytest.approx(last, rel=1e-6)
    assert resumed["unsharded"] == pytest.approx(last, rel=LOSS_RTOL)


@pytest.mark.distributed
def test_dp2_cp2_trains_like_one_process(four_ranks: dict[str, dict]) -> None:
    for engine in ("fsdp2", "simple_fsdp"):
        record = four_ranks[f"2,1:full_shard:{engine}:eager"]
        assert_trains_like_one_process(record)
        mesh = f"{'FSDP2' if engine == 'fsdp2' else 'SimpleFSDP'} full_shard on mesh dp_shard_cp=4"
        assert any(mesh in n for n in record["notes"]), record["notes"]
        # cp inside dp_shard: ranks 0,1 split data-parallel rank 0's sequences, ranks 2,3 rank 1's.
        assert record["dp"] == [[0, 2], [0, 2], [1, 2], [1, 2]]


@pytest.mark.distributed
def test_dp2_cp2_replicated_trains_like_one_process(four_ranks: dict[str, dict]) -> None:
    replicas = four_ranks["2,1:no_shard:simple_fsdp:eager"]
    assert_trains_like_one_process(replicas)
    assert any("SimpleFSDP no_shard on mesh dp_replicate_cp=4" in n for n in replicas["notes"])


@pytest.mark.distributed
def test_cp2_tp2_trains_like_one_process(four_ranks: dict[str, dict]) -> None:
    for engine, name in (("fsdp2", "FSDP2"), ("simple_fsdp", "SimpleFSDP")):
        record = four_ranks[f"2,2:full_shard:{engine}:eager"]
        assert_trains_like_one_process(record)
        assert "tensor parallel: tp=2 (sequence parallel, loss parallel)" in record["notes"]
        assert any(f"{name} full_shard on mesh dp_shard_cp=2" in n for n in record["notes"]), record["notes"]
        assert record["dp"] == [[0, 1]] * 4


@pytest.mark.distributed
def test_hybrid_shard_with_cp_trains_like_one_process(eight_ranks: dict[str, dict]) -> None:
    for engine, name in (("fsdp2", "FSDP2"), ("simple_fsdp", "SimpleFSDP")):
        record = eight_ranks[f"2,1:hybrid_shard:{engine}:eager"]
        assert_trains_like_one_process(record)
        mesh = f"{name} hybrid_shard on mesh dp_replicate=2 x dp_shard_cp=4"
        assert any(mesh in n for n in record["notes"]), record["notes"]
        assert record["dp"] == [[i // 2, 4] for i in range(8)]
