"""torchrun worker: what torch's tensor parallelism keeps in memory, measured on gloo ranks in bf16.

    torchrun --nproc-per-node 2 tests/executor/workers/tensor_parallel_memory.py --out result.json

Two measurements the planner's memory model prices (planner/cost/model_costs.py, memory.py):

- *block*: the runtime's tensor-parallel llama block (`executor.runtime.tensor_parallel`, the same
  layout torchtitan uses) runs forward on its sequence shard; saved-tensor hooks count the bytes
  autograd keeps for backward, each storage once, weights left out, per token of the whole sequence;
- *loss*: cross-entropy over vocabulary-sharded bf16 logits as torchtitan computes it (fp32 upcast
  under torch's `loss_parallel`), and the same over a plain tensor; torch's memory tracker reports
  the peak above the logits in forward and in backward, per logit element of the rank.

Rank 0 writes one JSON record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from executor.profile.blocks import model_config  # noqa: E402
from executor.runtime.activation_checkpoint import _recompute_all_context  # noqa: E402
from executor.runtime.distributed import exit_process  # noqa: E402
from executor.runtime.models.llama import RotaryEmbedding, TransformerBlock  # noqa: E402
from executor.runtime.tensor_parallel import _block_plan  # noqa: E402
from planner.catalog.models import catalog_model  # noqa: E402

MODEL = "llama-debug"
SEQ = 256
LOSS_TOKENS, LOSS_VOCAB = 512, 4096


def _block(tp_mesh) -> tuple[torch.nn.Module, RotaryEmbedding, torch.Tensor]:
    """The runtime's tensor-parallel block in bf16, its rotary tables and a sequence shard of input."""
    cfg = model_config(catalog_model(MODEL).model_dump())
    with torch.device("meta"):
        block = TransformerBlock(cfg)
    parallelize_module(block, tp_mesh, _block_plan())
    block.to_empty(device=torch.device("cpu"))
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0.0, 0.02)
    block.to(torch.bfloat16)
    rope = RotaryEmbedding(cfg.head_dim, max_len=SEQ, theta=cfg.rope_theta)
    rope.reset_buffers()
    shard = torch.randn(1, SEQ // tp_mesh.size(), cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    return block, rope, shard


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def block_saved_bytes_per_token(tp_mesh) -> float:
    block, rope, shard = _block(tp_mesh)
    weights = {_local(t).untyped_storage().data_ptr() for t in (*block.parameters(), *rope.buffers())}
    held: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept = _local(tensor)
        key = kept.untyped_storage().data_ptr()
        if key not in weights and key not in held:
            held[key] = kept  # alive until the end: no address is reused
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(shard, rope)
    return sum(t.untyped_storage().nbytes() for t in held.values()) / SEQ


def checkpointed_block_kept_bytes_per_token(tp_mesh) -> float:
    """What the compiled engine's whole-block checkpointing policy keeps beyond plain checkpointing
    (which keeps the block input alone), per token of the whole sequence. Run eagerly: the policy
    decides what is saved, not the compiler. The difference leaves out what both hold (the tracker
    also counts the rotary tables' casts and buffers of the collectives)."""

    def kept(**policy) -> int:
        block, rope, shard = _block(tp_mesh)
        wrapped = checkpoint_wrapper(block, preserve_rng_state=False, **policy)
        tracker = MemTracker()
        with tracker:
            before = _total(tracker, "current")
            wrapped(shard, rope)
            return _total(tracker, "current") - before

    policy = _recompute_all_context(keep_gathered_params=False)
    return (kept(context_fn=policy) - kept()) / SEQ


def _total(tracker: MemTracker, kind: str) -> int:
    return sum(
        nbytes for stats in tracker.get_tracker_snapshot(kind).values() for key, nbytes in stats.items()
        if str(key) == "Total"
    )


def loss_peaks(tp_mesh, *, parallel: bool) -> dict[str, float]:
    """Peak bytes above the bf16 logits per logit element of this rank: forward, then backward."""
    g = torch.Generator().manual_seed(0)
    columns = LOSS_VOCAB // tp_mesh.size()
    logits = torch.randn(LOSS_TOKENS, columns, generator=g).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, LOSS_VOCAB if parallel else columns, (LOSS_TOKENS,), generator=g)
    elements = logits.numel()
    tracker = MemTracker()
    tracker.track_external(logits)
    with tracker:
        base = _total(tracker, "current")
        with loss_parallel() if parallel else contextlib.nullcontext():
            x = DTensor.from_local(logits, tp_mesh, [Shard(-1)]) if parallel else logits
            loss = F.cross_entropy(x.float(), targets)
            forward = _total(tracker, "peak") - base
            tracker.reset_mod_stats()
            held = _total(tracker, "current") - base
            loss.backward()
            backward = _total(tracker, "peak") - base
    return {"forward": forward / elements, "held": held / elements, "backward": backward / elements}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    tp_mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    record = {
        "tp": tp_mesh.size(),
        "block_saved_bytes_per_token": block_saved_bytes_per_token(tp_mesh),
        "checkpointed_block_kept_bytes_per_token": checkpointed_block_kept_bytes_per_token(tp_mesh),
        "loss_parallel": loss_peaks(tp_mesh, parallel=True),
        "loss_plain": loss_peaks(tp_mesh, parallel=False),
    }
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(record))
    exit_process(0)


if __name__ == "__main__":
    main()
