"""Memory accounting: the breakdown, not only the total."""

from __future__ import annotations

import pytest

from contract.loss_slices import loss_chunks_for
from contract.mesh import Mesh
from contract.plan_document import upgrade_document
from planner.cost.estimate import Estimator
from planner.cost.memory import MEMORY_TERMS
from planner.cost.parameters import GIB
from planner.cost.setting import Choice
from planner.enumeration import enumerate_choices
from planner.plan import MemoryBreakdown
from planner.search import make_plan
from planner.search_setting import build_setting
from tests.planner.conftest import make_request

WHOLE_BATCH_OF_2 = {"micro_batch_size": 2, "grad_accum_steps": 1}
"""Two sequences per rank in one micro-batch."""


def choice(sharding: str, shard: int, replicas: int | None = None, **overrides) -> Choice:
    """A choice on 8 GPUs sharded over `shard` (replicated over the rest unless `replicas`)."""
    replicas = 8 // shard if replicas is None else replicas
    fields = dict(
        sharding=sharding,
        mesh=Mesh(dp_replicate=replicas, dp_shard=shard),
        blocks_per_unit=1,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        checkpointing="full",
        every_k=1,
        micro_batch_size=1,
        grad_accum_steps=2,
        compile=False,
    )
    return Choice(**{**fields, **overrides})


@pytest.fixture
def estimator() -> Estimator:
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=16)
    return Estimator(build_setting(request, None, None))


def test_full_shard_holds_16_bytes_per_param_over_n(estimator: Estimator) -> None:
    n_params = estimator.setting.model.num_params
    m = estimator.memory(choice("full_shard", 8))
    assert m.params == pytest.approx(4 * n_params / 8)  # fp32 master
    assert m.grads == pytest.approx(4 * n_params / 8)  # fp32 reduced gradients
    assert m.optimizer == pytest.approx(8 * n_params / 8)  # AdamW m and v
    assert m.sharded_states == pytest.approx(16 * n_params / 8)


def test_shard_grad_op_keeps_sharded_states_but_holds_unsharded_params(estimator: Estimator) -> None:
    n_params = estimator.setting.model.num_params
    zero3 = estimator.memory(choice("full_shard", 8))
    zero2 = estimator.memory(choice("shard_grad_op", 8))
    assert zero2.sharded_states == pytest.approx(zero3.sharded_states)
    # ZeRO-2 does not reshard after forward: every bf16 parameter stays gathered until backward.
    assert zero2.unsharded_params - zero3.unsharded_params > 2 * n_params * 0.9
    assert zero2.activations == zero3.activations


def test_no_shard_replicates_everything_like_ddp(estimator: Estimator) -> None:
    n_params = estimator.setting.model.num_params
    ddp = estimator.memory(choice("no_shard", 1, replicas=8))
    assert ddp.moment == "optimizer step"
    assert ddp.params == pytest.approx(4 * n_params)
    assert ddp.grads == pytest.approx(4 * n_params)
    # AdamW's m and v, and foreach AdamW's fp32 temporaries while it updates.
    assert ddp.optimizer == pytest.approx((8 + 4) * n_params)


def test_hybrid_states_shrink_with_the_shard_group_not_the_world(estimator: Estimator) -> None:
    n_params = estimator.setting.model.num_params
    hsdp = estimator.memory(choice("hybrid_shard", 4, replicas=2))
    assert hsdp.sharded_states == pytest.approx(16 * n_params / 4)


def test_checkpointing_trades_activations_only(estimator: Estimator) -> None:
    by_mode = {
        mode: estimator.memory(choice("full_shard", 8, checkpointing=mode, every_k=2))
        for mode in ("none", "selective", "op_selective", "full")
    }
    acts = {mode: m.activations for mode, m in by_mode.items()}
    assert acts["none"] > acts["selective"] > acts["full"]
    assert acts["none"] > acts["op_selective"] > acts["full"]
    assert len({m.sharded_states for m in by_mode.values()}) == 1


def test_activations_and_logits_scale_with_micro_batch(estimator: Estimator) -> None:
    one = estimator.moments(choice("full_shard", 8, checkpointing="none"))[0]
    two = estimator.moments(choice("full_shard", 8, checkpointing="none", **WHOLE_BATCH_OF_2))[0]
    assert one.moment == "loss"
    assert two.activations == pytest.approx(2 * one.activations)
    # The head's fp32 gradient accumulator (and one bf16 slice product) does not grow with tokens.
    head_gradients = (4 + 2) * estimator.setting.model.head.matmul_params
    assert two.logits - head_gradients == pytest.approx(2 * (one.logits - head_gradients))


def test_total_is_the_sum_of_its_parts(estimator: Estimator) -> None:
    m = estimator.memory(choice("full_shard", 8))
    parts = (
        m.params,
        m.grads,
        m.optimizer,
        m.activations,
        m.unsharded_params,
        m.grad_buffers,
        m.logits,
        m.workspace,
        m.allocator_reserve,
    )
    assert m.total == pytest.approx(sum(parts))
    assert m.total / GIB < 80


def test_with_one_micro_batch_the_backward_peak_holds_no_gradients_yet(estimator: Estimator) -> None:
    accumulating = estimator.memory(choice("full_shard", 8, checkpointing="none", grad_accum_steps=2))
    single = estimator.memory(choice("full_shard", 8, checkpointing="none", **WHOLE_BATCH_OF_2))
    n_params = estimator.setting.model.num_params
    assert accumulating.grads == pytest.approx(4 * n_params / 8)
    assert single.grads == 0.0 and single.activations > 0


def test_the_optimizer_step_is_the_peak_when_backward_holds_little(estimator: Estimator) -> None:
    # Replicated fp32 states dwarf one checkpointed sequence: the peak is in the update, with
    # every gradient and nothing transient.
    ddp = estimator.memory(
        choice("no_shard", 1, replicas=8, grad_accum_steps=1, micro_batch_size=2, compile=True)
    )
    n_params = estimator.setting.model.num_params
    assert ddp.grads == pytest.approx(4 * n_params)
    assert ddp.activations == 0.0 and ddp.logits == 0.0


def test_eager_no_shard_keeps_unsharded_copies_compiled_does_not(estimator: Estimator) -> None:
    eager = estimator.moments(choice("no_shard", 1, replicas=8, compile=False))[0]
    compiled = estimator.moments(choice("no_shard", 1, replicas=8, compile=True))[0]
    n_params = estimator.setting.model.num_params
    # bf16 compute copies of every parameter (FSDP2 gathers even over a group of one).
    # ... plus FSDP2's last all-gather output (one unit: here the 128k-vocabulary embedding).
    largest_unit = estimator.setting.model.embedding.num_params
    assert eager.unsharded_params == pytest.approx(2 * (n_params + largest_unit))
    # Compiled: only transient compute-dtype casts of the units in flight.
    assert compiled.unsharded_params < 0.25 * eager.unsharded_params


def test_the_breakdown_is_the_estimate_term_for_term() -> None:
    # One memory model: the plan's breakdown carries exactly the estimate's terms and its total.
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=16)
    plan = make_plan(request)
    breakdown = plan.prediction.memory_breakdown_gib
    assert set(MemoryBreakdown.model_fields) - {"moment"} == set(MEMORY_TERMS)
    assert breakdown.total == pytest.approx(plan.prediction.peak_memory_gib)


def test_a_plan_keeps_its_margin_below_the_usable_memory() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=64)
    plan = make_plan(request)
    p = plan.prediction
    assert p.usable_memory_gib is not None and p.memory_margin is not None
    assert p.usable_memory_gib < plan.cluster.gpu_spec.memory_gib  # the CUDA context is outside
    assert p.peak_memory_gib * (1 + p.memory_margin) <= p.usable_memory_gib
    assert "under-predicted" in (p.memory_margin_reason or "")
    for alternative in plan.alternatives:
        assert alternative.peak_memory_gib * (1 + p.memory_margin) <= p.usable_memory_gib


def test_slicing_the_loss_bounds_the_logits(estimator: Estimator) -> None:
    whole = estimator.moments(choice("full_shard", 8, checkpointing="none", **WHOLE_BATCH_OF_2))[0]
    sliced = estimator.moments(
        choice("full_shard", 8, checkpointing="none", **WHOLE_BATCH_OF_2, loss_chunks=8)
    )[0]
    vocab = estimator.setting.model.vocab_size
    # bf16: the compute-dtype logits and their fp32 copy (softmax and gradient in place), per slice.
    assert whole.logits - sliced.logits == pytest.approx(6.0 * (2 * 4096 - 1024) * vocab)
    assert sliced.total < whole.total


def test_the_search_slices_a_large_vocabulary_loss_and_prices_the_slices() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=64)
    plan = make_plan(request)
    tokens = plan.config.micro_batch_size * 8192
    vocab_share = 128256 // plan.config.mesh.tp  # the loss is vocabulary-parallel under tp
    assert plan.config.loss_chunks == loss_chunks_for(tokens, vocab_share, 2) > 1
    slice_tokens = -(-tokens // plan.config.loss_chunks)
    assert slice_tokens * vocab_share * 6.0 <= 1.0 * GIB


def test_the_first_optimizer_step_creates_states_and_temporaries() -> None:
    # One GPU, a small batch: the update (states + every gradient + foreach temporaries) is the peak.
    request = make_request("llama3-8b", "1x1xH200", seq_len=1024, sequences=1)
    setting = build_setting(request, None, None)
    e = Estimator(setting)
    one = choice("no_shard", 1, replicas=1, checkpointing="full", grad_accum_steps=1)
    backward, *_, update = e.moments(one)
    n_params = setting.model.num_params
    assert update.moment == "optimizer step" and update.total > backward.total
    assert update.optimizer == pytest.approx(12 * n_params)
    assert e.memory(one) == update


def test_compiled_configurations_do_not_repeat_wrap_units() -> None:
    # The compiled runtime never groups parameters by unit: the search lists each compiled
    # configuration once, and u2/u4 stay eager-only.
    request = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=16)
    setting = build_setting(request, None, None)
    compiled = [c for c in enumerate_choices(request, setting) if c.compile]
    assert compiled and {c.blocks_per_unit for c in compiled} == {1}
    eager = [c for c in enumerate_choices(request, setting) if not c.compile and c.sharding == "full_shard"]
    assert {c.blocks_per_unit for c in eager} == {1, 2, 4, 8}
    single = make_request("llama3-8b", "1x1xH200", seq_len=2048, sequences=4)
    assert {c.blocks_per_unit for c in enumerate_choices(single, build_setting(single, None, None))} == {1}


def test_plans_stored_before_schema_1_1_still_read() -> None:
    old = {
        "params": 1.0, "grads": 1.0, "optimizer": 2.0, "activations": 3.0, "unsharded_buffers": 0.5,
        "logits": 0.25, "workspace": 1.0, "fragmentation": 0.1,
    }
    document = upgrade_document({"schema_version": "1.0", "prediction": {"memory_breakdown_gib": old}})
    breakdown = MemoryBreakdown.model_validate(document["prediction"]["memory_breakdown_gib"])
    assert breakdown.unsharded_params == 0.5 and breakdown.allocator_reserve == 0.1
    assert breakdown.total == pytest.approx(8.85)


def test_recompute_happens_after_the_loss_is_gone(estimator: Estimator) -> None:
    full = choice("full_shard", 8, checkpointing="full", grad_accum_steps=1)
    loss, start, recompute, _ = estimator.moments(full)
    assert (loss.moment, start.moment, recompute.moment) == ("loss", "backward start", "backward recompute")
    assert recompute.logits == 0.0 and loss.logits > start.logits > 0
    assert recompute.activations > start.activations  # one block re-run beside what was kept
    # Among the blocks, gathers and reductions are a block's, not the head's.
    assert recompute.grad_buffers < start.grad_buffers
    assert len(estimator.moments(choice("full_shard", 8, checkpointing="none"))) == 3


def test_a_compiled_loss_holds_the_logits_and_their_gradient_in_the_compute_dtype(
    estimator: Estimator,
) -> None:
    # torchtitan's cross-entropy under torch.compile: the fp32 upcast and log-softmax are fused away,
    # so per logit it holds 2 bf16 bytes in forward and the gradient's 2 as backward starts, where the
    # plain autograd loss holds the fp32 copy and log-softmax too.
    plain, compiled = (
        estimator.moments(choice("full_shard", 8, checkpointing="none", engine="torchtitan", loss=loss,
                                 **WHOLE_BATCH_OF_2))
        for loss in ("autograd_fp32", "compiled_fp32")
    )
    logits = 2 * 4096 * estimator.setting.model.vocab_size
    assert compiled[0].logits == pytest.approx(2.0 * logits)
    assert plain[0].logits > compiled[0].logits + 4.0 * logits
    assert max(m.total for m in compiled) < max(m.total for m in plain)
