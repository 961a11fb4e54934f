"""torchrun worker: gradients of parallelized models against a single-process reference.

    torchrun --nproc-per-node N tests/executor/workers/parity.py --out result.json CASE [CASE ...]

CASE is `sharding:engine:backend[:ac[:precision[:micro_batches[:loss_chunks]]]]`, e.g.
`full_shard:simple_fsdp:inductor`, `hybrid_shard:fsdp2:eager`, `full_shard:simple_fsdp:eager:none:bf16`,
`no_shard:fsdp2:eager:none:fp32:2` or `full_shard:fsdp2:eager:none:fp32:1:3` (backend `eager`: no
torch.compile; ac `firstN`: checkpointing mode `blocks`, the first N blocks; precision `bf16pure`:
pure bf16 training, parameters, gradients, their reduction and
the optimizer's states in bf16; micro_batches: gradient accumulation steps the rank's share of the
batch is split into; loss_chunks: token slices of the output projection and loss, the plan's
`loss_chunks`).
Each case runs the runtime's own `train_step` and compares the gradients it holds before the
(zero learning rate) update.
Every case starts from the same weights (initialised per parameter name, so
independent of sharding) and sees the same global batch, split over ranks; the reference runs
the whole batch in one process, unsharded, in fp32. Rank 0 writes one record per case: loss,
worst relative gradient error, the parameters outside tolerance, and for inductor cases the
collectives in the generated code (one call per bucket).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import parse_plan  # noqa: E402
from executor.runtime.distributed import build_mesh, exit_process, init_distributed  # noqa: E402
from executor.runtime.materialize import clean_name, materialize  # noqa: E402
from executor.runtime.models import build_model  # noqa: E402
from executor.runtime.parallelize import Overrides, parallelize  # noqa: E402
from executor.runtime.step import train_step  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan  # noqa: E402
from tests.executor.workers.collector import skip_full_collections  # noqa: E402

SEED = 1234
# llama-debug with 2 blocks: the same kernels, half the graph to trace and compile.
PARITY_MODEL = {**LLAMA_DEBUG, "num_layers": 2}
FP32_RTOL = 1e-4
BF16_NORM_RTOL = 3e-2  # bf16 keeps ~3 significant digits: compare whole-tensor relative error


def global_batch(vocab: int, sequences: int, seq_len: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (sequences, seq_len + 1), generator=g)


def reference(plan, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    materialize(model, device=torch.device("cpu"), seed=SEED)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def count_collectives(codes: list[str]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for code in codes:
        for op in re.findall(r"torch\.ops\._c10d_functional\.(\w+)\.default\(", code):
            name = op.removesuffix("_out").removesuffix("_")
            if name != "wait_tensor":
                counts[name] += 1
    return dict(counts)


def run_case(case: str, world: int, cache: dict) -> dict:
    sharding, engine, backend, *rest = case.split(":")
    ac = rest[0] if rest else "none"
    precision = rest[1] if len(rest) > 1 else "fp32"
    accum = int(rest[2]) if len(rest) > 2 else 1
    loss_chunks = int(rest[3]) if len(rest) > 3 else 1
    compiled = backend != "eager"
    doc = debug_plan(
        micro_batch_size=2 // accum,
        grad_accum_steps=accum,
        sharding=sharding,
        nodes=world // 2,
        gpus_per_node=2,
        compile=compiled,
        checkpointing="none" if ac.startswith("first") else ac,
        every_k=2,
        bucket_mb=64.0 if compiled else 0.0,
        model=PARITY_MODEL,
        precision="bf16" if precision == "bf16pure" else precision,
        loss_chunks=loss_chunks,
    )
    if precision == "bf16pure":
        doc["training"]["state_dtype"] = "bfloat16"
        doc["config"]["reduce_dtype"] = "bfloat16"
    if ac.startswith("first"):
        blocks = int(ac.removeprefix("first"))
        doc["config"]["checkpointing"] = {"mode": "blocks", "every_k": 1, "blocks": blocks}
    plan = parse_plan(doc)
    env = init_distributed(plan)
    mesh = build_mesh(plan, env)
    tokens = global_batch(plan.model.vocab_size, plan.training.sequences, plan.training.seq_len)
    if "ref" not in cache:
        cache["ref"] = reference(plan, tokens)
    ref_loss, ref = cache["ref"]

    model = build_model(plan.model, seq_len=plan.training.seq_len)
    overrides = Overrides(engine=engine, compile=compiled, backend=backend if compiled else "inductor")
    par = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    materialize(par.module, device=env.device, seed=SEED)
    per_rank = plan.config.micro_batch_size * accum
    local = tokens[env.rank * per_rank : (env.rank + 1) * per_rank]
    optimizer = torch.optim.SGD(par.module.parameters(), lr=0.0)
    grads: dict[str, torch.Tensor] = {}

    def capture() -> None:
        for name, p in par.module.named_parameters():
            grads[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()

    def step() -> torch.Tensor:
        micro_batches = local.chunk(accum)
        result = train_step(
            par,
            optimizer,
            micro_batches,
            grad_accum_steps=accum,
            max_grad_norm=0.0,
            loss_chunks=plan.config.loss_chunks,
            before_update=capture,
        )
        return result.loss_sum / accum

    t0 = time.perf_counter()
    collectives = None
    if compiled and backend == "inductor":
        loss, codes = run_and_get_code(step)
        collectives = count_collectives(codes)
    else:
        loss = step()
    elapsed = time.perf_counter() - t0
    loss_sum = loss.detach().float().clone()
    dist.all_reduce(loss_sum)

    worst, worst_name, failures = 0.0, "", []
    for name, grad in grads.items():
        r = ref[clean_name(name)]
        err = ((grad.float() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
        if err > worst:
            worst, worst_name = err, clean_name(name)
        if precision.startswith("bf16"):
            ok = ((grad.float() - r).norm() / r.norm().clamp_min(1e-12)).item() < BF16_NORM_RTOL
        else:
            # rtol 1e-4, with an absolute floor scaled to the tensor (near-zero entries).
            ok = torch.allclose(grad, r, rtol=FP32_RTOL, atol=FP32_RTOL * r.abs().max().item())
        if not ok:
            failures.append(clean_name(name))
        expected = torch.bfloat16 if precision == "bf16pure" else torch.float32  # no fp32 master in pure bf16
        if grad.dtype != expected:
            failures.append(f"{clean_name(name)}: gradient dtype {grad.dtype}")
    return {
        "case": case,
        "loss": loss_sum.item() / world,
        "ref_loss": ref_loss,
        "max_rel_err": worst,
        "worst_param": worst_name,
        "failures": failures,
        "first_step_s": elapsed,
        "notes": par.notes,
        "collectives": collectives,
    }


def record_cases(cases: list[str], out: str, run: Callable[[str, dict], dict[str, Any]]) -> None:
    """Each case's record from `run(case, cache)` (one cache shared by the cases), without full
    collections; rank 0 prints each record and writes them all to `out`. Every worker's loop."""
    results: list[dict] = []
    cache: dict = {}
    skip_full_collections()
    for case in cases:
        results.append(run(case, cache))
        if dist.get_rank() == 0:
            print(json.dumps(results[-1]), flush=True)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    record_cases(args.cases, args.out, lambda case, cache: run_case(case, world, cache))


if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
