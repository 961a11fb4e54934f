"""Start from a Hugging Face checkpoint (`train.py --init-from DIR`), loaded straight into the
sharded parameters.

Runs after `parallelize` and `materialize(init=False)`: every parameter is then a DTensor (sharded
by FSDP2 or SimpleFSDP over the data-parallel dims, possibly also split by tensor parallelism on
the `tp` dim) whose local tensor is allocated but not yet filled. For each file of the checkpoint
in turn, each rank maps the file, computes which box of every global tensor it owns from the
DTensor's mesh and placements (the same computation distributed checkpointing uses), and copies
exactly that box out of the mapping into its local tensor, casting to the parameter's dtype. No
rank ever holds a full parameter, let alone the full model, and no collective runs; a rank reads
only the bytes of its own shards (whole rows for row-sharded weights).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from contract.model_config import ModelConfig
from executor.runtime import hf
from executor.runtime.materialize import clean_name
from executor.runtime.safetensors_io import SafetensorsCheckpoint, WeightsError


@dataclass(slots=True)
class LoadReport:
    """What `load_pretrained` did on this rank."""

    directory: Path
    architecture: str
    files: int = 0
    tensors: int = 0
    bytes_read: int = 0
    """Bytes this rank copied out of the checkpoint (its shards, in the source dtype)."""
    checkpoint_bytes: int = 0
    """Bytes of all the tensors the model uses, in the checkpoint."""
    seconds: float = 0.0
    unused: list[str] = field(default_factory=list)
    """Checkpoint tensors no parameter was read from (besides known buffers)."""
    cast: str = ""
    """`bfloat16 -> float32` when the source dtype differs from the parameters'."""

    def describe(self) -> str:
        line = (
            f"weights: {self.architecture} checkpoint {self.directory}: {self.tensors} tensors from "
            f"{self.files} file(s), {_mib(self.bytes_read)} read by this rank of "
            f"{_mib(self.checkpoint_bytes)}, {self.seconds:.2f} s"
        )
        if self.cast:
            line += f" (cast {self.cast})"
        if self.unused:
            shown = ", ".join(self.unused[:4]) + (" ..." if len(self.unused) > 4 else "")
            line += f"; warning: {len(self.unused)} checkpoint tensor(s) not used: {shown}"
        return line


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def local_box(param: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], torch.Tensor]:
    """(shape, global offset, local tensor) of this rank's piece of `param` (a DTensor or a plain
    tensor, which is its own piece)."""
    if not isinstance(param, DTensor):
        return tuple(param.shape), (0,) * param.dim(), param.data
    local = param.to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if tuple(shape) != tuple(local.shape):
        raise RuntimeError(  # a layout this loader does not understand: a bug, not a user error
            f"local shard shape {tuple(local.shape)} differs from the computed {tuple(shape)} for "
            f"placements {param.placements}"
        )
    return tuple(shape), tuple(offset), local


@torch.no_grad()
def load_pretrained(
    model: nn.Module, directory: str | Path, *, cfg: ModelConfig, seq_len: int, share: bool = False
) -> LoadReport:
    """Fill `model`'s (sharded, materialised) parameters from the Hugging Face checkpoint in
    `directory`, checking its config.json against `cfg` first. Every rank calls it; no collectives.
    `share`: `model` is a pipeline rank's share of the model, so the checkpoint's tensors of the
    other stages are not reported as unused."""
    from executor.runtime.models import GPT2, Llama  # the built-in models only

    if not isinstance(model, (Llama, GPT2)):
        raise WeightsError(
            "--init-from loads Hugging Face checkpoints into the built-in llama and gpt2 models only; "
            "a --model-factory model loads its own weights"
        )
    t0 = time.perf_counter()
    directory = Path(directory)
    config = hf.read_config(directory)
    hf.check_config(config, cfg, seq_len=seq_len, where=str(directory / "config.json"))
    checkpoint = SafetensorsCheckpoint(directory)
    params = {clean_name(n): p for n, p in model.named_parameters()}  # a tied weight once
    if any(p.is_meta for p in params.values()):
        raise RuntimeError("load_pretrained: materialise the model first (materialize(init=False))")
    # The buffers a checkpoint holds too (DeepSeek-V3's router bias), plain tensors on every rank.
    params |= {clean_name(n): b for n, b in model.named_buffers() if n.endswith(hf.LOADED_BUFFERS)}
    available = set(checkpoint.keys())
    sources = hf.sources(cfg, list(params), available, config=config)
    report = LoadReport(directory=directory, architecture=hf.hf_architecture(config))
    casts: set[str] = set()
    by_source: dict[str, tuple[str, hf.Source]] = {}
    for name, srcs in sources.items():
        for src in srcs:
            info = checkpoint.info(src.name)
            _check_shape(info.shape, src, params[name], name)
            report.checkpoint_bytes += info.nbytes
            if info.dtype != params[name].dtype:
                casts.add(f"{_dtype_name(info.dtype)} -> {_dtype_name(params[name].dtype)}")
            by_source[src.name] = (name, src)
    if not share:
        report.unused = sorted(n for n in available - set(by_source) if not n.endswith(hf.IGNORED_SUFFIXES))
    for file, names in checkpoint.files():
        wanted = [n for n in names if n in by_source]
        if wanted:
            report.files += 1
        for source_name in wanted:
            name, src = by_source[source_name]
            shape, offset, local = local_box(params[name])
            if src.expert is not None:
                # One expert's matrix of a stacked parameter: its slice, if this rank holds it.
                index = src.expert - offset[0]
                if not 0 <= index < shape[0]:
                    continue
                shape, offset, local = shape[1:], offset[1:], local[index]
            box = hf.to_runtime(file.tensor(source_name), src, shape, offset)
            local.copy_(box)
            report.tensors += 1
            report.bytes_read += box.numel() * box.element_size()
            del box
    report.cast = ", ".join(sorted(casts))
    report.seconds = time.perf_counter() - t0
    return report


def _check_shape(stored: tuple[int, ...], src: hf.Source, param: torch.Tensor, name: str) -> None:
    """Refuse a checkpoint tensor whose shape is not the runtime parameter's (or its expert slice's)."""
    if len(stored) not in (1, 2) and src.transpose:
        raise WeightsError(f"{src.name}: expected a matrix, got shape {list(stored)}")
    shape = tuple(stored[::-1] if src.transpose else stored)
    wanted = tuple(param.shape[1:] if src.expert is not None else param.shape)
    if shape != wanted:
        whose = f"expert {src.expert} of {name}" if src.expert is not None else name
        raise WeightsError(
            f"{src.name}: shape {list(stored)} in the checkpoint, the model's {whose} is {list(wanted)}"
            + (" (stored transposed)" if src.transpose else "")
        )
