"""torchrun worker: the vocabulary-parallel chunked loss against plain cross-entropy on full logits.

    torchrun --nproc-per-node 2 tests/executor/workers/vocab_parallel_loss.py --out result.json

Every rank builds the same hidden states, head weight and targets, keeps its rows of the weight
and runs `vocab_parallel_linear_cross_entropy`; the reference is `F.cross_entropy` on the full
fp32 logits in each process. Rank 0 writes one record per (dtype, chunks, mode): the loss of every
rank, the reference loss, and the relative errors of the hidden-state gradient (the ranks' shares
summed, as the head's reduce-scatter does) and of the weight gradient (the ranks' rows gathered).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from executor.runtime.distributed import exit_process  # noqa: E402
from executor.runtime.loss import VocabShard, vocab_parallel_linear_cross_entropy  # noqa: E402

TOKENS = (2, 23)  # 46 tokens: no chunk count used divides it evenly
HIDDEN, VOCAB = 16, 102
UPSTREAM = 2.5  # a non-unit upstream gradient: backward must scale the stored gradients


def inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(*TOKENS, HIDDEN, generator=g).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.3).to(dtype)
    targets = torch.randint(0, VOCAB, TOKENS, generator=g)
    return hidden, weight, targets


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(dtype: torch.dtype, chunks: int, mode: str) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, weight, targets = inputs(dtype)
    rows = VOCAB // world
    vocab = VocabShard(group=dist.group.WORLD.group_name, start=rank * rows)

    h = hidden.clone().requires_grad_()
    w = weight[vocab.start : vocab.start + rows].clone().requires_grad_()

    def loss_fn(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_linear_cross_entropy(h, w, t, chunks=chunks, vocab=vocab)

    if mode != "eager":
        torch._dynamo.reset()
        loss_fn = torch.compile(loss_fn, backend=mode, fullgraph=True)
    loss = loss_fn(h, w, targets)
    (UPSTREAM * loss).backward()
    grad_h = h.grad.float()
    dist.all_reduce(grad_h)
    pieces = [torch.empty_like(w.grad) for _ in range(world)]
    dist.all_gather(pieces, w.grad)
    losses = [torch.zeros((), dtype=torch.float32) for _ in range(world)]
    dist.all_gather(losses, loss.detach())

    ref_h, ref_w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = F.cross_entropy((ref_h @ ref_w.t()).flatten(0, 1).float(), targets.flatten())
    (UPSTREAM * ref).backward()
    return {
        "case": f"{str(dtype).removeprefix('torch.')}:{chunks}:{mode}",
        "losses": [x.item() for x in losses],
        "ref_loss": ref.item(),
        "loss_dtype": str(loss.dtype),
        "grad_dtypes": [str(h.grad.dtype), str(w.grad.dtype)],
        "hidden_grad_err": rel_err(grad_h, ref_h.grad),
        "weight_grad_err": rel_err(torch.cat(pieces), ref_w.grad),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    cases = [(torch.float32, 1, "eager"), (torch.float32, 3, "eager"), (torch.bfloat16, 4, "eager")]
    # Collectives inside the autograd.Function must trace into one graph (the model compiles whole).
    cases.append((torch.float32, 3, "aot_eager"))
    records = [run(*case) for case in cases]
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(records, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
