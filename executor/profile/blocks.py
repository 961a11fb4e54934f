"""Forward + backward time (and peak memory on GPU) of one of the model's own blocks.

A block is timed as the difference between the model with two blocks and with one (same small
vocabulary), so embeddings, head and loss cancel out and any built-in architecture works without
knowing its block's call signature. Every rank times the same blocks at the same time, because in
training all ranks compute at once and share the node's memory bandwidth and caches (a rank timed
alone runs faster than it ever will in training); rank 0 reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from contract.model_config import LatentAttention, ModelConfig, MoeConfig
from executor.profile.measure import Budget, synchronize, time_call
from executor.runtime.activation_checkpoint import apply_activation_checkpointing
from executor.runtime.materialize import materialize
from executor.runtime.models import build_model, find_parts

CHECKPOINTING = ("none", "op_selective", "full")
PROFILE_VOCAB = 512


NESTED_CONFIGS: dict[str, type] = {"moe": MoeConfig, "latent_attention": LatentAttention}
"""ModelConfig's fields that are dataclasses of their own: a ModelSpec dict holds them as dicts."""


def model_config(spec: dict) -> ModelConfig:
    """The runtime's ModelConfig from a planner ModelSpec dict (unknown keys ignored, at every level)."""
    fields = _known(ModelConfig, spec)
    for key, cls in NESTED_CONFIGS.items():
        if isinstance(fields.get(key), dict):
            fields[key] = cls(**_known(cls, fields[key]))
    return ModelConfig(**fields)


def _known(cls: type, values: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def _step_seconds(
    cfg: ModelConfig,
    layers: int,
    *,
    checkpointing: str,
    micro_batch: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[float, int | None]:
    small = dataclasses.replace(cfg, num_layers=layers, vocab_size=min(cfg.vocab_size, PROFILE_VOCAB))
    model = build_model(small, seq_len=seq_len)
    materialize(model, device=device, seed=0)
    model.to(dtype)
    apply_activation_checkpointing(
        model, find_parts(model), mode=checkpointing, every_k=1, keep_gathered_params=False
    )
    tokens = torch.randint(0, small.vocab_size, (micro_batch, seq_len), device=device)

    def step() -> None:
        model(tokens).float().mean().backward()
        model.zero_grad(set_to_none=True)

    if device.type == "cuda":
        step()
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    seconds = time_call(step, device, repeats=3, warmup=1)
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
    return seconds, peak


def block_samples(
    spec: dict,
    *,
    seq_len: int,
    micro_batches: list[int],
    device: torch.device,
    budget: Budget,
    on_sample: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """One sample per (micro-batch, checkpointing) that fits in the budget, and at least one however
    long it takes (a loaded machine's profile still prices the model's blocks); [] off rank 0."""
    samples: list[dict] = []
    rank = dist.get_rank() if dist.is_initialized() else 0
    if spec.get("architecture") in ("llama", "gpt2"):
        cfg = model_config(spec)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        for micro_batch in micro_batches:
            for checkpointing in CHECKPOINTING:
                if budget.exhausted and samples:
                    break
                kwargs = dict(
                    checkpointing=checkpointing,
                    micro_batch=micro_batch,
                    seq_len=seq_len,
                    device=device,
                    dtype=dtype,
                )
                one, peak_one = _step_seconds(cfg, 1, **kwargs)
                two, peak_two = _step_seconds(cfg, 2, **kwargs)
                seconds = two - one
                if seconds <= 0:  # too small to resolve against noise
                    continue
                samples.append(
                    {
                        "model": spec.get("name", "model"),
                        "micro_batch_size": micro_batch,
                        "seq_len": seq_len,
                        "checkpointing": checkpointing,
                        "compile": False,
                        "dtype": "bfloat16" if dtype == torch.bfloat16 else "float32",
                        "seconds": seconds,
                        "peak_memory_bytes": max(0, peak_two - peak_one) if peak_one is not None else None,
                    }
                )
                on_sample(f"block mb{micro_batch} {checkpointing}")
    if dist.is_initialized():
        dist.barrier()
    return samples if rank == 0 else []
