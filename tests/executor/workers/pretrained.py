"""torchrun worker: load a Hugging Face checkpoint into sharded parameters (`--init-from`'s path).

    torchrun --nproc-per-node 2 tests/executor/workers/pretrained.py --out result.json \
        --batch batch.pt --expected expected.pt CKPT_DIR:CASE [CKPT_DIR:CASE ...]

CASE is `sharding:engine[:tp2|:ep2]`, e.g. `full_shard:fsdp2`, `full_shard:simple_fsdp` (eager),
`no_shard:simple_fsdp:tp2` (mesh dp 1 x tp 2), `full_shard:fsdp2:ep2` (an MoE model's experts split
over 2 expert-parallel ranks). For each, every rank builds the plan's model on the
meta device, parallelizes it, allocates it without initialising (`materialize(init=False)`) and
runs `load_pretrained`. Rank 0 writes one record per case and rank: for every parameter the largest
difference between the rank's local shard and the box of the expected full tensor (`expected.pt`,
written by the test: runtime name -> full tensor in the runtime's layout) that the shard's DTensor
says it holds, the box's offset, the load report, and the first training step's loss (the global
mean over `batch.pt` [global batch, seq + 1], each data-parallel rank taking its own rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.plan_document import parse_plan  # noqa: E402
from executor.runtime.distributed import build_mesh, data_parallel_rank, exit_process, init_distributed  # noqa: E402
from executor.runtime.materialize import clean_name, materialize  # noqa: E402
from executor.runtime.models import build_model  # noqa: E402
from executor.runtime.optim import OptimizerSettings, build_optimizer  # noqa: E402
from executor.runtime.parallelize import Overrides, parallelize  # noqa: E402
from executor.runtime.pretrained import load_pretrained, local_box  # noqa: E402
from executor.runtime.step import train_step  # noqa: E402
from tests.executor.plan_factory import debug_plan  # noqa: E402

CPU = torch.device("cpu")


def run_case(spec: str, *, batch: torch.Tensor, expected: dict, meshes: dict) -> dict:
    directory, case = spec.split(":", 1)
    sharding, engine, *rest = case.split(":")
    tp = 2 if rest == ["tp2"] else 1
    ep = 2 if rest == ["ep2"] else 1
    model_doc = json.loads((Path(directory) / "plan_model.json").read_text())
    world = int(os.environ["WORLD_SIZE"])
    micro = batch.shape[0] // (world // tp)  # the whole batch is one global step
    doc = debug_plan(
        sharding=sharding,
        gpus_per_node=world,
        tp=tp,
        seq_len=batch.shape[1] - 1,
        micro_batch_size=micro,
        model=model_doc,
    )
    doc["config"]["mesh"]["ep"] = ep
    plan = parse_plan(doc)
    env = init_distributed(plan)
    shape = (plan.config.mesh.dp_replicate, plan.config.mesh.dp_shard, tp, ep)
    if shape not in meshes:
        meshes[shape] = build_mesh(plan, env)
    mesh = meshes[shape]
    dp_rank, dp_size = data_parallel_rank(mesh)
    model = build_model(plan.model, seq_len=plan.training.seq_len)
    par = parallelize(model, plan=plan, mesh=mesh, overrides=Overrides(engine=engine, compile=False))
    materialize(par.module, device=CPU, seed=0, init=False)
    report = load_pretrained(par.module, directory, cfg=plan.model, seq_len=plan.training.seq_len)
    full = expected[directory]
    errors, offsets, placements = {}, {}, {}
    for name, param in par.module.named_parameters():
        name = clean_name(name)
        box_shape, offset, local = local_box(param)
        want = full[name][tuple(slice(o, o + s) for o, s in zip(offset, box_shape, strict=True))]
        errors[name] = (local.float() - want.float()).abs().max().item() if local.numel() else 0.0
        offsets[name] = list(offset)
        placements[name] = str(getattr(param, "placements", None))
    rows = batch.shape[0] // dp_size
    mine = batch[dp_rank * rows : (dp_rank + 1) * rows]
    optimizer = build_optimizer(par.module, OptimizerSettings(lr=1e-3), device=CPU)
    result = train_step(par, optimizer, iter([mine]), grad_accum_steps=1, max_grad_norm=1.0, loss_chunks=1)
    loss = result.loss_sum.clone()
    dist.all_reduce(loss)
    return {
        "case": spec,
        "rank": dist.get_rank(),
        "dp": [dp_rank, dp_size],
        "errors": errors,
        "offsets": offsets,
        "placements": placements,
        "local_numel": sum(local_box(p)[2].numel() for p in par.module.parameters()),
        "loss": loss.item() / dist.get_world_size(),
        "report": report.describe(),
        "notes": par.notes,
        "bytes_read": report.bytes_read,
        "checkpoint_bytes": report.checkpoint_bytes,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batch", type=Path, required=True)
    p.add_argument("--expected", type=Path, required=True)
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    torch.set_num_threads(1)
    batch = torch.load(args.batch)
    expected = torch.load(args.expected)
    records, meshes = [], {}
    for case in args.cases:
        record = run_case(case, batch=batch, expected=expected, meshes=meshes)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, record)
        records += gathered
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(records, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)  # gloo's threads can abort interpreter teardown (see exit_process)
