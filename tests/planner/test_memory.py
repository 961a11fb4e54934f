"""Memory accounting: the breakdown, not only the total."""

from __future__ import annotations

import pytest

from planner.cost.estimate import Choice, Estimator
from planner.cost.parameters import GIB
from planner.search import build_setting
from tests.planner.conftest import make_request


def choice(sharding: str, shard: int, **overrides) -> Choice:
    fields = dict(
        sharding=sharding,
        shard_group=shard,
        replicate_group=8 // shard,
        blocks_per_unit=1,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        checkpointing="full",
        every_k=1,
        micro_batch=1,
        grad_accum=2,
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
    assert zero2.unsharded - zero3.unsharded > 2 * n_params * 0.9
    assert zero2.activations == zero3.activations


def test_no_shard_replicates_everything_like_ddp(estimator: Estimator) -> None:
    n_params = estimator.setting.model.num_params
    ddp = estimator.memory(choice("no_shard", 1, replicate_group=8))
    assert ddp.params == pytest.approx(4 * n_params)
    assert ddp.grads == pytest.approx(4 * n_params)
    assert ddp.optimizer == pytest.approx(8 * n_params)


def test_hybrid_states_shrink_with_the_shard_group_not_the_world(estimator: Estimator) -> None:
    n_params = estimator.setting.model.num_params
    hsdp = estimator.memory(choice("hybrid_shard", 4, replicate_group=2))
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
    one = estimator.memory(choice("full_shard", 8, checkpointing="none"))
    two = estimator.memory(choice("full_shard", 8, checkpointing="none", micro_batch=2, grad_accum=1))
    assert two.activations == pytest.approx(2 * one.activations)
    assert two.logits == pytest.approx(2 * one.logits)


def test_total_is_the_sum_of_its_parts(estimator: Estimator) -> None:
    m = estimator.memory(choice("full_shard", 8))
    parts = (
        m.params,
        m.grads,
        m.optimizer,
        m.activations,
        m.unsharded,
        m.logits,
        m.workspace,
        m.fragmentation,
    )
    assert m.total == pytest.approx(sum(parts))
    assert m.total / GIB < 80


def test_with_one_micro_batch_the_backward_peak_holds_no_gradients_yet(estimator: Estimator) -> None:
    accumulating = estimator.memory(choice("full_shard", 8, checkpointing="none", grad_accum=2))
    single = estimator.memory(choice("full_shard", 8, checkpointing="none", micro_batch=2, grad_accum=1))
    n_params = estimator.setting.model.num_params
    assert accumulating.grads == pytest.approx(4 * n_params / 8)
    assert single.grads == 0.0 and single.activations > 0


def test_the_optimizer_step_is_the_peak_when_backward_holds_little(estimator: Estimator) -> None:
    # Replicated fp32 states dwarf one checkpointed sequence: the peak is in the update, with
    # every gradient and nothing transient.
    ddp = estimator.memory(
        choice("no_shard", 1, replicate_group=8, grad_accum=1, micro_batch=2, compile=True)
    )
    n_params = estimator.setting.model.num_params
    assert ddp.grads == pytest.approx(4 * n_params)
    assert ddp.activations == 0.0 and ddp.logits == 0.0


def test_eager_no_shard_keeps_unsharded_copies_compiled_does_not(estimator: Estimator) -> None:
    eager = estimator.memory(choice("no_shard", 1, replicate_group=8, compile=False))
    compiled = estimator.memory(choice("no_shard", 1, replicate_group=8, compile=True))
    n_params = estimator.setting.model.num_params
    # bf16 compute copies of every parameter (FSDP2 gathers even over a group of one).
    assert eager.unsharded - compiled.unsharded > 2 * n_params * 0.9
