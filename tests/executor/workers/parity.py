"""torchrun worker: gradients of parallelized models vs a single-process reference.

Run: torchrun --nproc-per-node N tests/executor/workers/parity.py --out result.json CASE [CASE ...]
where CASE is `sharding:engine:compiled[:ac]`, e.g. `full_shard:simple_fsdp:inductor` or
`hybrid_shard:fsdp2:eager`. Every case uses the same data and initial weights; rank 0 writes one
record per case (max relative gradient error, loss, pass/fail at rtol 1e-4) to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from executor.runtime.distributed import build_mesh, init_distributed  # noqa: E402
from executor.runtime.materialize import clean_name, materialize  # noqa: E402
from executor.runtime.models import build_model  # noqa: E402
from executor.runtime.parallelize import Overrides, parallelize  # noqa: E402
from executor.runtime.plan import parse_plan  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan  # noqa: E402

SEED = 1234
# llama-debug with 2 blocks: same kernels, half the graph to trace and compile.
PARITY_MODEL = {**LLAMA_DEBUG, "num_layers": 2}


def global_batch(vocab: int, sequences: int, seq_len: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (sequences, seq_len + 1), generator=g)


def reference_grads(plan, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    materialize(model, device=torch.device("cpu"), seed=SEED)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def run_case(case: str, world: int, ref_cache: dict) -> dict:
    sharding, engine, mode, *rest = case.split(":")
    ac = rest[0] if rest else "none"
    gpn = 2
    nodes = world // gpn
    doc = debug_plan(
        sharding=sharding,
        nodes=nodes,
        gpus_per_node=gpn,
        compile=mode != "eager",
        checkpointing=ac,
        every_k=2,
        bucket_mb=64.0 if mode != "eager" else 0.0,
        model=PARITY_MODEL,
    )
    plan = parse_plan(doc)
    env = init_distributed(plan)
    mesh = build_mesh(plan, env)
    key = "ref"
    tokens = global_batch(plan.model.vocab_size, plan.training.sequences, plan.training.seq_len)
    if key not in ref_cache:
        ref_cache[key] = reference_grads(plan, tokens)
    ref_loss, ref = ref_cache[key]
    overrides = Overrides(
        engine=engine, compile=mode != "eager", backend="inductor" if mode == "eager" else mode
    )
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    par = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    materialize(par.module, device=env.device, seed=SEED)
    mbs = plan.config.micro_batch_size
    dp_rank = env.rank  # data-parallel rank: every rank is a data-parallel rank here
    local = tokens[dp_rank * mbs : (dp_rank + 1) * mbs]
    t0 = time.perf_counter()
    logits = par.forward(local[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), local[:, 1:].flatten())
    loss.backward()
    elapsed = time.perf_counter() - t0
    loss_t = loss.detach().clone()
    dist.all_reduce(loss_t)
    worst, worst_name, failures = 0.0, "", []
    for name, p in par.module.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        r = ref[clean_name(name)]
        err = ((grad - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
        if err > worst:
            worst, worst_name = err, clean_name(name)
        try:
            torch.testing.assert_close(grad, r, rtol=1e-4, atol=1e-4 * r.abs().max().item())
        except AssertionError:
            failures.append(clean_name(name))
    return {
        "case": case,
        "loss": loss_t.item() / world,
        "ref_loss": ref_loss,
        "max_rel_err": worst,
        "worst_param": worst_name,
        "failures": failures,
        "first_step_s": elapsed,
        "notes": par.notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    torch.manual_seed(0)
    world = int(__import__("os").environ["WORLD_SIZE"])
    results, cache = [], {}
    for case in args.cases:
        results.append(run_case(case, world, cache))
        if dist.get_rank() == 0:
            print(json.dumps(results[-1]), flush=True)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
