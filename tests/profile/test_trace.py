"""The meta-device tracer against the catalog's analytic counts and against a real forward pass.

What the catalog counts and what the trace measures, reconciled (both per token):
- parameters: equal, a tied weight once.
- forward FLOPs: torch's FLOP counter counts attention in full (not halved for the causal mask), as
  the catalog's `attention_flops_convention` does; so a block is 2 x matmul weights + that.
- saved bytes: the catalog counts saved *elements* (`saved_elems`, priced at the compute dtype's
  size). Trained in bf16, each RMSNorm upcasts its input to fp32 and keeps that copy (4 bytes an
  element, not 2), which the planner prices as `saved_fp32_elems` (`eager_saved_bytes`); norms and
  attention also keep per-row fp32 statistics (one rstd per norm, one log-sum-exp per head), a few
  bytes per token the planner leaves out. The count is stated in `expected_block_saved_bytes`; the
  2% tolerance applies to it unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from executor.profile.trace import BlockType, Trace, trace_factory
from executor.runtime.materialize import materialize
from planner.catalog.models import catalog_model, model_from_hf_config
from planner.cost.model_costs import eager_saved_bytes, model_costs
from planner.specs import ModelSpec
from tests.profile.trace_models import encoder, llama_debug

SEQ = 256
FACTORIES = "tests.profile.trace_models"
TOLERANCE = 0.02

QWEN2_CONFIG: dict[str, Any] = {
    # Qwen2-style: q/k/v biases, grouped-query attention, head tied to the embedding.
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "_name_or_path": "tiny-qwen2",
    "vocab_size": 3000,
    "hidden_size": 384,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "max_position_embeddings": 1024,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
MISTRAL_CONFIG: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "_name_or_path": "tiny-mistral",
    "vocab_size": 4096,
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1536,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def expected_block_saved_bytes(spec: ModelSpec) -> float:
    """The catalog's saved elements of a Llama block as bytes in bf16 training (module docstring)."""
    block = model_costs(spec, SEQ).blocks[0]
    statistics = 4 * (2 + spec.num_heads)  # fp32: an rstd per norm, a log-sum-exp per head
    return eager_saved_bytes(block, 2) + statistics


def assert_close(measured: float, expected: float, what: str) -> None:
    assert abs(measured - expected) <= TOLERANCE * expected, f"{what}: traced {measured}, catalog {expected}"


def assert_matches_catalog(trace: Trace, spec: ModelSpec) -> None:
    costs = model_costs(spec, SEQ)
    analytic_block = costs.blocks[0]
    blocks = [u for u in trace.units if u.is_block]
    rest = [u for u in trace.units if not u.is_block]

    assert trace.num_params == costs.num_params
    assert len(blocks) == spec.num_layers
    assert rest[0].num_params == costs.embedding.num_params  # the tied weight counts at the embedding
    assert sum(u.num_params for u in rest[1:]) == costs.head.num_params
    for unit in blocks:
        assert unit.num_params == analytic_block.num_params
        assert_close(
            unit.fwd_flops_per_token,
            2 * analytic_block.matmul_params + analytic_block.attention_flops_convention,
            f"{unit.name} forward FLOPs",
        )
        assert_close(unit.activation_bytes_per_token, expected_block_saved_bytes(spec), f"{unit.name} saved")
    assert_close(sum(u.fwd_flops_per_token for u in rest), 2 * costs.head.matmul_params, "head FLOPs")

    # The planner prices the written graph as the same model: parameters and training FLOPs (6N).
    graph = model_costs(ModelSpec.model_validate(trace.as_model_spec()), SEQ)
    assert graph.num_params == costs.num_params
    assert_close(graph.flops_per_token, costs.flops_per_token, "training FLOPs per token")


def test_the_debug_model_agrees_with_the_catalog() -> None:
    trace = trace_factory(f"{FACTORIES}:llama_debug", kwargs={"seq_len": SEQ}, seq_len=SEQ)

    assert_matches_catalog(trace, catalog_model("llama-debug"))
    assert [u.name for u in trace.units] == [
        "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output",
    ]
    assert trace.block_types == [BlockType("TransformerBlock", 4, "layers.0", "layers.3")]
    assert trace.notes == []


@pytest.mark.parametrize("config", [QWEN2_CONFIG, MISTRAL_CONFIG], ids=["qwen2-tied", "mistral"])
def test_a_model_built_from_a_hugging_face_config_agrees_with_the_catalog(
    config: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))

    trace = trace_factory(f"{FACTORIES}:llama_from_hf_config", kwargs={"config": str(path)}, seq_len=SEQ)

    assert_matches_catalog(trace, model_from_hf_config(config))
    assert trace.block_types[0].count == config["num_hidden_layers"]


def real_saved_bytes_per_token(model: nn.Module, blocks: nn.ModuleList, *, vocab: int) -> list[float]:
    """Bytes each block keeps for backward in a real CPU bf16 forward (storages once, no weights)."""
    model.to(torch.bfloat16)
    weights = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    held: dict[int, torch.Tensor] = {}
    per_block = [0] * len(blocks)
    current: list[int | None] = [None]
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i))
        block.register_forward_hook(lambda m, a, out: current.__setitem__(0, None))

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in weights and key not in held and current[0] is not None:
            held[key] = tensor  # alive until the end: no address is reused
            per_block[current[0]] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(0, vocab, (1, SEQ)))
    return [b / SEQ for b in per_block]


def test_saved_bytes_on_meta_equal_a_real_bf16_forward() -> None:
    """The meta trace (fused-attention bookkeeping included) keeps exactly what a real CPU run keeps."""
    traced = trace_factory(f"{FACTORIES}:llama_debug", kwargs={"seq_len": SEQ}, seq_len=SEQ)

    model = llama_debug(seq_len=SEQ)
    materialize(model, device=torch.device("cpu"), seed=0)
    real = real_saved_bytes_per_token(model, model.layers, vocab=2048)

    assert [u.activation_bytes_per_token for u in traced.units if u.is_block] == real


def test_attention_inside_torch_modules_keeps_no_attention_weights() -> None:
    """nn.TransformerEncoderLayer calls attention from inside nn.MultiheadAttention: the trace must
    still keep what the fused kernel keeps, not the [seq, seq] weights of the meta math path."""
    traced = trace_factory(f"{FACTORIES}:encoder", kwargs={}, seq_len=SEQ)
    blocks = [u.activation_bytes_per_token for u in traced.units if u.is_block]

    model = encoder()
    real = real_saved_bytes_per_token(model, model.layers, vocab=1000)

    # CPU LayerNorm keeps its mean and rstd in bf16, GPU kernels (and meta) in fp32: 2 norms x 2 x 2 B.
    # (The math path's attention weights would add about 8 heads x 256 keys x 4 B per token.)
    assert blocks == [b + 8 for b in real]


def test_blocks_of_different_shapes_are_different_types() -> None:
    trace = trace_factory(f"{FACTORIES}:two_widths", kwargs={"each": 2}, seq_len=16)

    assert [(t.name, t.count, t.first, t.last) for t in trace.block_types] == [
        ("_Block", 2, "blocks.0", "blocks.1"),
        ("Linear", 1, "blocks.2", "blocks.2"),
        ("_Block#2", 2, "blocks.3", "blocks.4"),
    ]
    narrow, wide = trace.units[1], trace.units[4]
    assert (narrow.num_params, wide.num_params) == (32 * 32 + 32 + 2 * 32, 64 * 64 + 64 + 2 * 64)
    assert [u.name for u in trace.units if not u.is_block] == ["embed", "head"]


def test_a_model_built_off_the_meta_device_is_traced_on_it_and_said_so() -> None:
    trace = trace_factory(f"{FACTORIES}:on_cpu", kwargs={}, seq_len=8)

    assert [(u.name, u.num_params) for u in trace.units] == [("0", 1600), ("1", 272)]
    assert any("off the meta device" in note for note in trace.notes)
    assert any("no repeated blocks found" in note for note in trace.notes)
