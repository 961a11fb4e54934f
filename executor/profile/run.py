"""Calibration run: `torchrun --nproc-per-node N -m executor.profile.run -o profile.json [...]`.

Measures the machine briefly (GEMMs at the model's own shapes, memory bandwidth, collectives over
message sizes for the whole group, the whole node and node-local groups of every power-of-two size
(the tensor-parallel group sizes), comm/compute contention, the usable device memory, and, when a
model is given, its blocks and whole training steps, eager and compiled, with their peak memory, and
for a mixture of experts its routed experts' grouped GEMMs beside dense ones of the same work)
within a time budget, and writes a CalibrationProfile JSON on rank 0. Imports only the standard
library and torch, so it runs wherever training would.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from contract.calibration_profile import PROFILE_SCHEMA_VERSION
from executor.profile.device import allocator_config, catalog_gpu, runtime_versions
from executor.profile.grouped_gemm import grouped_gemm_profile
from executor.profile.measure import (
    Budget,
    bandwidth_samples,
    collective_samples,
    float8_matmul_samples,
    matmul_samples,
    overlap_contention,
)
from executor.runtime.distributed import exit_process, start_process_group

# Share of the budget per phase (the contention probe takes a few seconds and is not budgeted);
# blocks and training steps only run when a model is given, grouped GEMMs when it is a mixture of
# experts. Half the steps' share is kept for the compiled shapes (see executor/profile/step.py).
PHASES = {
    "matmul": 0.25,
    "grouped_gemm": 0.05,
    "bandwidth": 0.05,
    "collectives": 0.3,
    "blocks": 0.15,
    "steps": 0.45,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Profile this machine for fsdp-planner calibration.")
    parser.add_argument("-o", "--output", type=Path, default=Path("profile.json"))
    parser.add_argument("--budget-s", type=float, default=120.0, help="Total time allowance (seconds).")
    parser.add_argument("--model-json", type=Path, help="The model spec (planner ModelSpec JSON) to profile.")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batches", default="1,2", help="Micro-batch sizes whose shapes to time.")
    parser.add_argument(
        "--optimizer",
        default="adamw",
        choices=["adamw", "sgd"],
        help="Optimizer of the timed steps.",
    )
    parser.add_argument("--name", default=None, help="Name stored in the profile.")
    parser.add_argument("--max-message-mib", type=float, default=None, help="Largest collective message.")
    return parser.parse_args(argv)


MIN_PHASE_SHARE = 0.25
"""No phase gets less than this part of its share of the whole budget."""


class PhaseBudgets:
    """Each phase's allowance is its share of the time still left, so time a phase does not use
    (collectives that reach the largest message early, a small model's blocks) goes to the next.
    A phase that overran (a large collective on a loaded machine) still leaves every later phase
    a quarter of its own share: a short profile then runs past its budget instead of missing the
    model's blocks and steps."""

    def __init__(self, total_s: float, shares: dict[str, float]) -> None:
        self.total_s, self.shares, self.started = total_s, dict(shares), time.perf_counter()
        self.floors = {k: MIN_PHASE_SHARE * total_s * v / sum(shares.values()) for k, v in shares.items()}

    def take(self, phase: str) -> Budget:
        left = max(0.0, self.total_s - (time.perf_counter() - self.started))
        share = self.shares[phase] / sum(self.shares.values())
        del self.shares[phase]
        return Budget(max(left * share, self.floors[phase]))


class Progress:
    """A one-line progress bar on rank 0 (stderr), driven by elapsed share of the budget."""

    def __init__(self, total_s: float, enabled: bool) -> None:
        self.total_s, self.enabled, self.start = total_s, enabled, time.perf_counter()

    def __call__(self, what: str) -> None:
        if not self.enabled:
            return
        share = min(1.0, (time.perf_counter() - self.start) / self.total_s)
        bar = "#" * int(share * 30)
        sys.stderr.write(f"\r[{bar:<30}] {share:4.0%} {what[:60]:<60}")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def collective_groups(world: int, local_world: int) -> list[tuple[int, str]]:
    """(group size, link) of every group whose collectives the profile measures, in order.

    The whole world first ("inter" when it spans nodes), then node-local groups of consecutive
    ranks, largest first: the whole node, and every power of two from 2 up that divides the GPUs
    per node, which are the tensor-parallel group sizes (TP runs its per-layer collectives inside a
    node). A size is measured once per link: on one node the world is the node. Groups are only
    formed when every node has the same number of ranks.
    """
    if world < 2:
        return []
    measured = [(world, "inter" if world > local_world else "intra")]
    if local_world < 2 or world % local_world:
        return measured
    powers = {1 << p for p in range(1, local_world.bit_length())}
    sizes = {local_world} | {size for size in powers if local_world % size == 0}
    for size in sorted(sizes, reverse=True):
        if (size, "intra") not in measured:
            measured.append((size, "intra"))
    return measured


def own_group(size: int, world: int, rank: int) -> dist.ProcessGroup:
    """This rank's group among the world split into groups of `size` consecutive ranks.

    dist.new_group is collective over the whole world: every rank creates every group, in the
    same order, and keeps only the one it belongs to.
    """
    groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world, size)]
    return groups[rank // size]


def setup() -> tuple[torch.device, str, int]:
    """Initialise the process group (cuda+nccl or cpu+gloo); returns device, backend, local world."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if "RANK" in os.environ and not dist.is_initialized():
        start_process_group(device, timedelta(minutes=10))  # as the trainer's (gloo: one worker thread)
    return device, backend, local_world


def fingerprint(device: torch.device, backend: str, local_world: int) -> dict:
    world = dist.get_world_size() if dist.is_initialized() else 1
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peers = local_world > 1 and torch.cuda.can_device_access_peer(
            0, min(1, torch.cuda.device_count() - 1)
        )
        link = "p2p" if peers else "pcie"
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version()) if backend == "nccl" else None
    else:
        name = "cpu" + (f" ({platform.processor()})" if platform.processor() else "")
        link, nccl = "shm", None
    return {
        "device_name": name,
        "device_count": world,
        "num_nodes": max(1, world // max(local_world, 1)),
        "gpus_per_node": local_world,
        "backend": backend,
        "link_class": link,
        "torch_version": torch.__version__,
        **runtime_versions(),
        "nccl_version": nccl,
    }


def memory_capacity(device: torch.device) -> tuple[int | None, int | None]:
    """(free, total) device bytes once CUDA and the process group are up, before any model: what
    training can use. The smallest over ranks (the fullest GPU decides what fits). None on CPU."""
    if device.type != "cuda":
        return None, None
    if dist.is_initialized():
        # NCCL creates its communicator (and its buffers) on the first collective: make that
        # happen before reading what is free.
        dist.all_reduce(torch.zeros(1, device=device))
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    both = torch.tensor([free, total], dtype=torch.int64, device=device)
    if dist.is_initialized():
        dist.all_reduce(both, op=dist.ReduceOp.MIN)
    return int(both[0].item()), int(both[1].item())


def model_shapes(
    model: dict | None, seq_len: int, micro_batches: list[int], on_gpu: bool
) -> list[tuple[int, int, int]]:
    """(m, n, k) of the model's matmuls per micro-batch, plus a square sweep for the curve's shape."""
    squares = [256, 512, 1024, 2048, 4096, 8192] if on_gpu else [64, 128, 256, 512, 768]
    shapes = [(s, s, s) for s in squares]
    if model is None:
        return shapes
    h = model["hidden_size"]
    f = model.get("intermediate_size") or 4 * h
    heads = model["num_heads"]
    kv = (model.get("num_kv_heads") or heads) * (h // heads)
    for mb in micro_batches:
        t = mb * seq_len
        shapes += [(t, h, h), (t, kv, h), (t, f, h), (t, h, f)]
    return shapes


def run(args: argparse.Namespace) -> dict:
    device, backend, local_world = setup()
    usable_bytes, device_bytes = memory_capacity(device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    progress = Progress(args.budget_s, enabled=rank == 0)
    model = json.loads(args.model_json.read_text()) if args.model_json else None
    micro_batches = [int(x) for x in str(args.micro_batches).split(",") if x.strip()]
    on_gpu = device.type == "cuda"
    phases = dict(PHASES)
    if model is None:
        phases.pop("blocks")
        phases.pop("steps")
    if not (model or {}).get("moe"):
        phases.pop("grouped_gemm")
    budgets = PhaseBudgets(args.budget_s, phases)

    dtypes = [torch.bfloat16, torch.float32] if on_gpu else [torch.float32]
    shapes = model_shapes(model, args.seq_len, micro_batches, on_gpu)
    matmul_budget = budgets.take("matmul")
    matmul = matmul_samples(shapes, dtypes, device, matmul_budget, progress)
    matmul += float8_matmul_samples(shapes, device, matmul_budget, progress)
    grouped = None
    if "grouped_gemm" in phases:
        grouped = grouped_gemm_profile(
            model,
            seq_len=args.seq_len,
            micro_batches=micro_batches,
            device=device,
            budget=budgets.take("grouped_gemm"),
            on_sample=progress,
        )
    progress("memory bandwidth")
    mib = 1 << 20
    sizes = [64 * mib, 256 * mib, 1024 * mib] if on_gpu else [8 * mib, 32 * mib, 128 * mib]
    bandwidth = bandwidth_samples(sizes, device, budgets.take("bandwidth"))

    collectives: list[dict] = []
    if world > 1:
        max_bytes = int((args.max_message_mib or (1024 if on_gpu else 64)) * mib)
        message_sizes = [1 << p for p in range(10, 31, 2) if (1 << p) <= max_bytes]
        measured = collective_groups(world, local_world)
        # Each group takes its share of the collectives time still left (what the world leaves
        # unused goes to the smaller groups after it), never less than a quarter of an equal share.
        shares = PhaseBudgets(
            budgets.take("collectives").seconds, {f"{size} {link}": 1.0 for size, link in measured}
        )
        for size, link in measured:
            collectives += collective_samples(
                group=own_group(size, world, rank) if size < world else None,
                member=True,
                group_size=size,
                link=link,
                sizes_bytes=message_sizes,
                device=device,
                budget=shares.take(f"{size} {link}"),
                on_sample=progress,
            )
    progress("overlap contention")
    contention = overlap_contention(
        device, matmul_size=4096 if on_gpu else 384, message_bytes=(256 if on_gpu else 8) * mib
    )
    blocks: list[dict] = []
    if model is not None:
        from executor.profile.blocks import block_samples

        blocks = block_samples(
            model,
            seq_len=args.seq_len,
            micro_batches=micro_batches,
            device=device,
            budget=budgets.take("blocks"),
            on_sample=progress,
        )
    steps: list[dict] = []
    if model is not None:
        from executor.profile.step import step_samples

        steps = step_samples(
            model,
            seq_len=args.seq_len,
            micro_batch=max(micro_batches),
            optimizer=args.optimizer,
            gpus_per_node=local_world,
            device=device,
            budget=budgets.take("steps"),
            on_sample=progress,
        )
    progress("done")
    progress.done()
    return {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "name": args.name,
        "gpu": catalog_gpu(device),
        "fingerprint": fingerprint(device, backend, local_world),
        "model": model,
        "matmul": matmul,
        # Left out for a dense model (as in profiles written before it existed): nothing to time.
        **({"grouped_gemm": grouped} if grouped is not None else {}),
        "memory_bandwidth": bandwidth,
        "collectives": collectives,
        "blocks": blocks,
        "steps": steps if rank == 0 else [],
        "overlap_contention": contention,
        "usable_memory_bytes": usable_bytes,
        "device_memory_bytes": device_bytes,
        # The reserve beyond allocated bytes is the allocator's: the fit uses it only when the steps
        # ran under the allocator the launchers set (planner/memory_calibration.py).
        "allocator_config": allocator_config(),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    profile = run(args)
    if not dist.is_initialized() or dist.get_rank() == 0:
        args.output.write_text(json.dumps(profile, indent=2) + "\n")
        print(f"calibration profile written to {args.output}", file=sys.stderr)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)
