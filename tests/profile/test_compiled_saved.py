"""What inductor's partitioner saves for backward in a compiled block, against the catalog's count.

Compiled, a block does not keep what eager autograd keeps: the min-cut partitioner of torch.compile
saves matmul results and recomputes cheap elementwise ones from them in backward (a norm's
normalised value, SwiGLU's silu, a residual sum). The planner prices compiled plans with
`UnitCost.compiled_saved_elems`; this test compiles the runtime's own blocks with inductor, reads
the partitioned forward graph's saved outputs (the tensors it hands to backward) and checks the
count per token. Parameters and rotary tables are not activations (the tables are left out) and
the per-row fp32 statistics (rstd, log-sum-exp) are a few bytes per token the planner leaves out:
the 2% tolerance covers them, as in tests/profile/test_trace.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch._inductor.compile_fx as compile_fx
from torch import nn

from contract.model_config import ModelConfig
from executor.runtime.models.gpt2 import Block
from executor.runtime.models.llama import RotaryEmbedding, TransformerBlock
from planner.cost.model_costs import UnitCost, model_costs
from planner.specs import ModelSpec

SEQ = 128
TOLERANCE = 0.02
LLAMA = ModelConfig(
    name="gqa-llama",
    architecture="llama",
    vocab_size=256,
    hidden_size=256,
    num_layers=1,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=688,
    max_seq_len=SEQ,
)
GPT2 = ModelConfig(
    name="tiny-gpt2",
    architecture="gpt2",
    vocab_size=256,
    hidden_size=256,
    num_layers=1,
    num_heads=8,
    intermediate_size=1024,
    max_seq_len=SEQ,
)


@contextmanager
def saved_outputs() -> Iterator[list[torch.Tensor]]:
    """The example values of every compiled forward graph's saved outputs, as inductor partitions it."""
    found: list[torch.Tensor] = []
    partition = compile_fx.min_cut_rematerialization_partition

    def spy(joint: torch.fx.GraphModule, inputs: list, *args: object, **kwargs: object) -> tuple:
        forward, backward = partition(joint, inputs, *args, **kwargs)
        num_outputs = kwargs["num_fwd_outputs"]
        (outputs,) = forward.graph.find_nodes(op="output")[0].args
        found.extend(node.meta["val"] for node in outputs[num_outputs:] if "val" in node.meta)
        return forward, backward

    compile_fx.min_cut_rematerialization_partition = spy
    try:
        yield found
    finally:
        compile_fx.min_cut_rematerialization_partition = partition


def _saved_elems_per_token(
    cfg: ModelConfig, block: nn.Module, run: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> float:
    torch._dynamo.reset()
    x = torch.randn(1, SEQ, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with saved_outputs() as saved:
        run(torch.compile(block, fullgraph=True), x)
    assert saved, "the compiled block saved nothing: the partitioner was not reached"
    # The rotary tables (seq x head_dim) are the model's, shared by every block: not activations.
    sequence_sized = [t for t in saved if SEQ in t.shape and t.shape != (SEQ, cfg.head_dim)]
    return sum(t.numel() * t.element_size() for t in sequence_sized) / SEQ / 2  # bf16 elements


def _block_costs(cfg: ModelConfig) -> UnitCost:
    spec = ModelSpec.model_validate({k: v for k, v in dataclasses.asdict(cfg).items() if v is not None})
    return model_costs(spec, SEQ).blocks[0]


def _catalog(cfg: ModelConfig) -> float:
    count = _block_costs(cfg).compiled_saved_elems
    assert count is not None
    return count


def test_compiled_llama_block_saves_what_the_catalog_prices() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(LLAMA).to(torch.bfloat16)
    rope = RotaryEmbedding(LLAMA.head_dim, max_len=SEQ, theta=LLAMA.rope_theta).to(torch.bfloat16)
    measured = _saved_elems_per_token(LLAMA, block, lambda compiled, x: compiled(x, rope))
    assert measured == pytest.approx(_catalog(LLAMA), rel=TOLERANCE)
    # Well under what eager autograd keeps (the catalog's `saved_elems`): the reason for the count.
    assert measured < 0.85 * _block_costs(LLAMA).saved_elems


def test_compiled_gpt2_block_saves_what_the_catalog_prices() -> None:
    torch.manual_seed(0)
    block = Block(GPT2).to(torch.bfloat16)
    measured = _saved_elems_per_token(GPT2, block, lambda compiled, x: compiled(x))
    assert measured == pytest.approx(_catalog(GPT2), rel=TOLERANCE)
