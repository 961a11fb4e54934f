"""torchrun worker: a tiny mixture-of-experts llama, sharded, against one process (issue 40).

    torchrun --nproc-per-node 2 tests/executor/workers/moe_parity.py --out result.json CASE [CASE ...]

CASE is `model:sharding:engine:backend[:ac[:mesh]]`: model `moe` (2 MoE blocks, 4 experts top-2, 1
shared, softmax router with the auxiliary loss) or `mla` (latent attention, a dense first block, a
sigmoid router balanced by its bias); mesh `epN` or `epNtpM` (expert parallelism over N ranks of the
shard group, with tp M: the world's other ranks are data-parallel); e.g. `moe:full_shard:fsdp2:eager`,
`moe:full_shard:simple_fsdp:inductor`, `moe:full_shard:fsdp2:eager:none:ep2tp2`.
Each case runs the runtime's `train_step` on its rank's sequences and compares the gradients before
the (zero learning rate) update. The reference runs in one process, unsharded, in fp32, over the same
global batch as the ranks' slices accumulated (each rank's auxiliary loss is its own tokens', as in
the sharded run: the load-balancing loss is not linear in the batch). The bias-balanced cases also
compare the routers' biases after the step's update (token counts summed over the ranks).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import parse_plan  # noqa: E402
from executor.runtime.distributed import (  # noqa: E402
    build_mesh,
    data_parallel_rank,
    exit_process,
    init_distributed,
)
from executor.runtime.materialize import clean_name, materialize  # noqa: E402
from executor.runtime.models import build_model  # noqa: E402
from executor.runtime.models.moe import BIAS_UPDATE_RATE, moe_layers, set_aux_loss_scale  # noqa: E402
from executor.runtime.parallelize import Overrides, parallelize  # noqa: E402
from executor.runtime.step import train_step  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan  # noqa: E402
from tests.executor.workers.parity import FP32_RTOL, SEED, global_batch, record_cases  # noqa: E402

_MOE = {"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 128, "num_shared_experts": 1}
MODELS = {
    "moe": {**LLAMA_DEBUG, "num_layers": 2, "moe": _MOE},
    "mla": {
        **LLAMA_DEBUG,
        "num_layers": 2,
        "moe": {**_MOE, "first_dense_layers": 1, "router": "sigmoid", "router_bias": True},
        "latent_attention": {
            "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "q_lora_rank": 96,
        },
    },
}


def reference(plan, tokens: torch.Tensor, dp: int) -> tuple[float, dict[str, torch.Tensor], dict]:
    """Loss, gradients and the routers' biases after the update, of one process over the `dp`
    data-parallel ranks' slices."""
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    materialize(model, device=torch.device("cpu"), seed=SEED)
    set_aux_loss_scale(model, 1.0 / dp)
    losses = []
    for piece in tokens.chunk(dp):
        loss = model(piece[:, :-1], piece[:, 1:])
        (loss / dp).backward()
        losses.append(loss.item())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for layer in moe_layers(model):  # `update_router_bias` without the all-reduce: one process
        if layer.router.has_bias:
            counts = layer.router.tokens_per_expert.float()
            layer.router.score_bias.add_(BIAS_UPDATE_RATE * torch.sign(counts.mean() - counts))
    return sum(losses) / dp, grads, _biases(model)


def _biases(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {clean_name(n): b.detach().clone() for n, b in model.named_buffers() if n.endswith("score_bias")}


def run_case(case: str, world: int, cache: dict) -> dict:
    name, sharding, engine, backend, *rest = case.split(":")
    ac = rest[0] if rest else "none"
    ep, tp = _mesh(rest[1] if len(rest) > 1 else "")
    compiled = backend != "eager"
    # hybrid_shard: two "nodes", each a shard group, replicated across them.
    nodes = 2 if sharding == "hybrid_shard" else 1
    doc = debug_plan(
        micro_batch_size=2, sharding=sharding, compile=compiled, checkpointing=ac, every_k=1,
        bucket_mb=64.0 if compiled else 0.0, model=MODELS[name], name=f"{name}-parity",
        nodes=nodes, gpus_per_node=world // nodes, tp=tp,
    )
    doc["config"]["mesh"]["ep"] = ep
    plan = parse_plan(doc)
    env = init_distributed(plan)
    mesh = build_mesh(plan, env)
    dp_rank, dp = data_parallel_rank(mesh)
    tokens = global_batch(plan.model.vocab_size, plan.training.sequences, plan.training.seq_len)
    if (name, dp) not in cache:
        cache[(name, dp)] = reference(plan, tokens, dp)
    ref_loss, ref, ref_biases = cache[(name, dp)]

    model = build_model(plan.model, seq_len=plan.training.seq_len)
    overrides = Overrides(engine=engine, compile=compiled, backend=backend if compiled else "inductor")
    par = parallelize(model, plan=plan, mesh=mesh, overrides=overrides)
    materialize(par.module, device=env.device, seed=SEED)
    per_rank = plan.config.micro_batch_size
    local = tokens[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    optimizer = torch.optim.SGD(par.module.parameters(), lr=0.0)
    grads: dict[str, torch.Tensor] = {}

    def capture() -> None:
        for pname, p in par.module.named_parameters():
            grads[pname] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()

    t0 = time.perf_counter()
    result = train_step(
        par, optimizer, [local], grad_accum_steps=1, max_grad_norm=0.0, loss_chunks=1, before_update=capture
    )
    elapsed = time.perf_counter() - t0
    loss_sum = result.loss_sum.detach().float().clone()
    dist.all_reduce(loss_sum)  # every tp rank holds its data-parallel rank's loss: divide by the world

    worst, worst_name, failures = 0.0, "", []
    for pname, grad in grads.items():
        r = ref[clean_name(pname)]
        err = ((grad.float() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
        if err > worst:
            worst, worst_name = err, clean_name(pname)
        if not torch.allclose(grad, r, rtol=FP32_RTOL, atol=FP32_RTOL * r.abs().max().item()):
            failures.append(clean_name(pname))
    biases = _biases(par.module)
    for bname, bias in ref_biases.items():
        if not torch.equal(biases[bname], bias) or bias.abs().sum() == 0:
            failures.append(f"{bname}: {biases[bname].tolist()} != {bias.tolist()}")
    return {
        "case": case,
        "loss": loss_sum.item() / world,
        "dp": dp,
        "ref_loss": ref_loss,
        "max_rel_err": worst,
        "worst_param": worst_name,
        "failures": failures,
        "first_step_s": elapsed,
        "notes": par.notes,
        "bias_updates": len(ref_biases),
        "compared": len(grads),
    }


def _mesh(spec: str) -> tuple[int, int]:
    """(ep, tp) of a case's mesh field (`ep2`, `ep2tp2`; empty: 1, 1)."""
    found = re.fullmatch(r"(?:ep(\d+))?(?:tp(\d+))?", spec)
    assert found is not None, f"mesh {spec!r}: write epN or epNtpM"
    return int(found[1] or 1), int(found[2] or 1)


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
