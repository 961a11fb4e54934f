"""Single-process unit tests of the runtime's pieces: plan reading (the mesh, schema 1.x plans,
tensor-parallel rules), models, init, data sampling, schedule, AC."""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from contract.mesh import Mesh
from contract.plan_document import PlanError, parse_plan
from executor.profile.run import MIN_PHASE_SHARE, PhaseBudgets
from executor.runtime import parallelize as parallelize_module
from executor.runtime.activation_checkpoint import checkpointed_indices
from executor.runtime.compile import inductor_options
from executor.runtime.data import BatchIndex, SyntheticTokens
from executor.runtime.materialize import materialize
from executor.runtime.models import ModelFactoryError, build_model, find_parts
from executor.runtime.models.common import sdpa_causal
from executor.runtime.optim import lr_factor
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan
from tests.older_schemas import as_schema_1

SMALL = {
    **LLAMA_DEBUG,
    "num_layers": 2,
    "hidden_size": 64,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 128,
}
GPT2_SMALL = {
    **SMALL,
    "architecture": "gpt2",
    "num_kv_heads": None,
    "intermediate_size": None,
    "tie_word_embeddings": True,
    "max_seq_len": 64,
}


def model_config(dims: dict):
    return parse_plan(debug_plan(model=dims, seq_len=32)).model


@pytest.mark.parametrize("dims", [SMALL, {**SMALL, "qkv_bias": True}, GPT2_SMALL])
def test_models_are_causal_and_initialised_reproducibly(dims: dict) -> None:
    cfg = model_config(dims)
    model = build_model(cfg, seq_len=32)
    assert all(p.is_meta for p in model.parameters())
    materialize(model, device=torch.device("cpu"), seed=3)
    again = build_model(cfg, seq_len=32)
    materialize(again, device=torch.device("cpu"), seed=3)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, cfg.vocab_size)
    # Changing a future token must not change earlier positions' logits.
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % cfg.vocab_size
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])
    # Initial loss is close to a uniform guess: the init is sane.
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 1.0


def test_gpt2_head_is_tied_and_parts_keep_tied_weights_together() -> None:
    model = build_model(model_config(GPT2_SMALL), seq_len=32)
    assert model.lm_head.weight is model.wte.weight
    parts = find_parts(model)
    assert model.wte not in parts.inputs and parts.outputs == [] and len(parts.blocks) == 2


@pytest.mark.parametrize("dims", [GPT2_SMALL, {**SMALL, "tie_word_embeddings": True}], ids=["gpt2", "llama"])
def test_tied_weights_stay_tied_when_materialized_unsharded(dims: dict) -> None:
    model = build_model(model_config(dims), seq_len=32)
    materialize(model, device=torch.device("cpu"), seed=3)
    embedding, head = (
        (model.wte, model.lm_head) if dims is GPT2_SMALL else (model.tok_embeddings, model.output)
    )
    assert head.weight is embedding.weight and not head.weight.is_meta
    # One parameter, initialised by the embedding's rule (the first name it is reached by).
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})
    assert head.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_grouped_query_attention_equals_repeated_heads() -> None:
    q, k, v = torch.randn(2, 8, 5, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), is_causal=True
    )
    torch.testing.assert_close(sdpa_causal(q, k, v), expected)


def test_user_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "class Tiny(torch.nn.Module):\n"
        "    def __init__(self, vocab):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(vocab, 8)\n"
        "        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))\n"
        "        self.out = torch.nn.Linear(8, vocab)\n"
        "    def forward(self, t):\n"
        "        h = self.emb(t)\n"
        "        for b in self.blocks: h = b(h)\n"
        "        return self.out(h)\n"
        "def build(cfg):\n    return Tiny(cfg.vocab_size)\n"
        "def no_args():\n    return Tiny(5)\n"
        "def not_a_module():\n    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = model_config(SMALL)
    model = build_model(cfg, seq_len=32, factory="my_models:build")
    assert model.out.out_features == cfg.vocab_size and len(find_parts(model).blocks) == 3
    assert build_model(cfg, seq_len=32, factory="my_models:no_args").out.out_features == 5
    for spec, message in [
        ("my_models:not_a_module", "not an nn.Module"),
        ("my_models:missing", "has no attribute"),
        ("no_such_pkg.mod:fn", "cannot import"),
        ("my_models", "package.module:function"),
    ]:
        with pytest.raises(ModelFactoryError, match=message):
            build_model(cfg, seq_len=32, factory=spec)
    layer_graph = parse_plan(debug_plan(model={**SMALL, "architecture": "layer_graph"})).model
    with pytest.raises(ModelFactoryError, match="--model-factory"):
        build_model(layer_graph, seq_len=32)


def test_sampling_is_stateless_and_independent_of_the_split() -> None:
    data = SyntheticTokens(vocab_size=100, seq_len=16, seed=5)
    # The global batch of step 3: 8 sequences, as 2 ranks x 2 micro-batches x 2, or 4 ranks x 1 x 2.
    split_a = [data.batch(BatchIndex(3, m, r, 2, 2)) for m in range(2) for r in range(2)]
    split_b = [data.batch(BatchIndex(3, 0, r, 4, 2)) for r in range(4)]
    torch.testing.assert_close(torch.cat(split_a), torch.cat(split_b))
    assert not torch.equal(data.batch(BatchIndex(4, 0, 0, 2, 2)), split_a[0])
    batch = torch.cat(split_a)
    assert batch.shape == (8, 17) and batch.dtype == torch.int64 and int(batch.max()) < 100
    # Motifs repeat: the second half of each row is predictable from the first.
    for row in batch:
        assert any(torch.equal(row[p:], row[:-p]) for p in range(1, 17))


def test_lr_schedule_warmup_then_cosine() -> None:
    f = [lr_factor(s, total_steps=100, warmup_steps=10, min_ratio=0.1) for s in range(1, 101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(f[9:]))
    assert f[-1] == pytest.approx(0.1) and f[54] == pytest.approx(0.55, abs=0.01)


def test_checkpointed_blocks_match_the_planner() -> None:
    assert checkpointed_indices("selective", 2, 6) == [1, 3, 5]  # blocks k, 2k, ... (1-based)
    assert checkpointed_indices("selective", 3, 7) == [2, 5]
    assert checkpointed_indices("full", 1, 3) == [0, 1, 2] == checkpointed_indices("op_selective", 1, 3)
    assert checkpointed_indices("none", 1, 3) == []
    assert checkpointed_indices("blocks", 1, 80, blocks=50) == list(range(50))  # the first 50 of 80


def test_calibration_phases_pass_unused_time_on() -> None:
    budgets = PhaseBudgets(100.0, {"matmul": 1.0, "collectives": 1.0, "steps": 2.0})
    assert budgets.take("matmul").seconds == pytest.approx(25.0, rel=0.01)
    # matmul's 25 s were not used: collectives and steps share all 100 s still left.
    assert budgets.take("collectives").seconds == pytest.approx(100.0 / 3, rel=0.01)
    assert budgets.take("steps").seconds == pytest.approx(100.0, rel=0.01)


def test_a_phase_that_overran_leaves_later_phases_a_floor() -> None:
    budgets = PhaseBudgets(8.0, {"collectives": 1.0, "steps": 1.0})
    budgets.started -= 20.0  # collectives took 20 s of an 8 s budget
    budgets.take("collectives")
    assert budgets.take("steps").seconds == pytest.approx(MIN_PHASE_SHARE * 4.0)


@pytest.mark.parametrize(
    ("kwargs", "mesh"),
    [({}, Mesh(dp_shard=2)), ({"sharding": "hybrid_shard", "nodes": 2}, Mesh(dp_replicate=2, dp_shard=2))],
)
def test_schema_1_plans_read_as_their_mesh(kwargs: dict, mesh: Mesh) -> None:
    current = parse_plan(debug_plan(**kwargs))
    old = parse_plan(as_schema_1(debug_plan(**kwargs)))
    assert old.config.mesh == mesh == current.config.mesh
    assert dataclasses.replace(old, schema_version="2.0") == current
    # A 1.x plan without a replica count: the one upgrader reads what the world size leaves (the
    # planner once read 1 here while the runtime refused the plan).
    hybrid = as_schema_1(debug_plan(sharding="hybrid_shard", nodes=2))
    del hybrid["config"]["replicate_group_size"]
    assert parse_plan(hybrid).config.mesh == Mesh(dp_replicate=2, dp_shard=2)
    unsized = {**hybrid, "cluster": {"gpu": "cpu"}}
    with pytest.raises(PlanError, match=r"plan\.config\.replicate_group_size: missing"):
        parse_plan(unsized)


def test_tensor_parallel_plans_batch_per_data_parallel_rank() -> None:
    plan = parse_plan(debug_plan(gpus_per_node=4, tp=2, micro_batch_size=3, grad_accum_steps=2))
    mesh = plan.config.mesh
    assert (mesh.dp_replicate, mesh.dp_shard, mesh.tp, mesh.dp, mesh.world_size) == (1, 2, 2, 2, 4)
    # A tp group shares its sequences: 3 x 2 x 2 data-parallel ranks, not x 4 ranks.
    assert plan.training.sequences == 12


@pytest.mark.parametrize(
    ("kwargs", "mutate", "message"),
    [
        ({}, lambda c: c["mesh"].update(tp=2), "= 4 ranks, but the cluster has 2"),
        (
            {"gpus_per_node": 4},
            lambda c: c["mesh"].update(dp_shard=2, dp_replicate=2),
            "must be 1 for full_shard",
        ),
        (
            {"sharding": "no_shard"},
            lambda c: c["mesh"].update(dp_shard=2, dp_replicate=1),
            "must be 1 for no_shard",
        ),
        (
            {"sharding": "hybrid_shard", "nodes": 2},
            lambda c: c["mesh"].update(dp_shard=4, dp_replicate=1),
            "hybrid_shard needs a shard group (dp_shard x cp) and dp_replicate of at least 2",
        ),
        (
            {"gpus_per_node": 4, "tp": 2},
            lambda c: c.update(micro_batch_size=4),
            "x 2 data-parallel ranks = 8",
        ),
        ({}, lambda c: c["mesh"].update(tp=0, dp_shard=2), "plan.config.mesh.tp must be a whole number >= 1"),
    ],
)
def test_mesh_rules(kwargs: dict, mutate, message: str) -> None:
    document = debug_plan(**kwargs)
    mutate(document["config"])
    with pytest.raises(PlanError) as err:
        parse_plan(document)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("model", "tp", "message"),
    [
        (
            GPT2_SMALL,
            2,
            "tp=2: tensor parallelism needs a llama-family model (the runtime splits its attention, MLP and "
            "vocabulary), not 'gpt2'; tp 1 runs without it",
        ),
        ({**SMALL, "architecture": "layer_graph"}, 2, "not 'layer_graph'"),
        # SMALL: 4 heads, 2 kv heads, ffn 96, vocab 128.
        (SMALL, 4, "plan.config.mesh.tp: tp=4 must divide each of num_heads 4, num_kv_heads 2"),
        ({**SMALL, "intermediate_size": 99}, 2, "intermediate_size 99, vocab_size 128"),
        (
            {**SMALL, "vocab_size": 129},
            2,
            "vocab_size 129, seq_len 32 (sequence parallelism splits it), gpus_per_node 2 (tensor "
            "parallelism stays inside a node and splits heads, FFN and vocabulary evenly)",
        ),
    ],
)
def test_tensor_parallel_needs_llama_and_even_splits(model: dict, tp: int, message: str) -> None:
    with pytest.raises(PlanError) as err:
        parse_plan(debug_plan(model=model, gpus_per_node=tp, tp=tp, seq_len=32))
    assert message in str(err.value)
    assert parse_plan(debug_plan(model=SMALL, gpus_per_node=2, tp=2, seq_len=32)).config.mesh.tp == 2


def test_tensor_parallel_error_names_what_the_degree_must_divide() -> None:
    # llama-debug: 8 heads, 4 kv heads, ffn 768, vocab 2048, seq 64: tp 8 splits all but the kv heads.
    # The rule and its words are contract.mesh's, as the planner's refusal of a --tp pin has them.
    with pytest.raises(PlanError) as err:
        parse_plan(debug_plan(gpus_per_node=8, tp=8))
    assert "plan.config.mesh.tp: tp=8 must divide each of num_heads 8, num_kv_heads 4" in str(err.value)
    assert "pick a common divisor" in str(err.value)


def test_async_tp_asks_inductor_to_micro_pipeline_only_where_symmetric_memory_is(monkeypatch) -> None:
    config = dataclasses.replace(parse_plan(debug_plan(compile=True, tp=2)).config, async_tp=True)
    asked, _ = inductor_options(config, micro_pipeline_tp=True)
    assert asked["_micro_pipeline_tp"] is True
    assert "_micro_pipeline_tp" not in inductor_options(config)[0]
    enabled: list[str] = []
    monkeypatch.setattr(parallelize_module, "enable_symm_mem_for_group", enabled.append)
    group = types.SimpleNamespace(group_name="tp-group-7")
    cuda = types.SimpleNamespace(device_type="cuda", get_group=lambda: group)
    on, note = parallelize_module.enable_async_tensor_parallel(cuda)
    assert on and enabled == ["tp-group-7"] and "micro-pipelines" in note
    off, note = parallelize_module.enable_async_tensor_parallel(types.SimpleNamespace(device_type="cpu"))
    assert not off and "not on cpu" in note and enabled == ["tp-group-7"]
