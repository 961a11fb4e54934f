"""Distributed checkpoints: sharded model + optimizer state with torch.distributed.checkpoint (DCP).

Layout of `--checkpoint-dir`:
  step-00000040/            one complete checkpoint (DCP shards + .metadata)
    train_state.json        step, data position (the step: sampling is stateless), plan hash, ...
    rng/rank-00003.pt       each rank's torch RNG state
A checkpoint is written to `step-N.partial/` and renamed once every rank has finished, so a job
killed mid-save never leaves a directory that looks complete. Parameter names are the model's own
(`get_state_dict` strips activation-checkpoint / compile wrappers), so a checkpoint resumes under
another AC or compile setting, and DCP reshards it if the mesh changed.

Pipeline parallelism: each rank's model is its stages' share under the whole model's parameter
names (`executor.runtime.pipeline`), so the ranks together save the whole model, and the
optimizer state is saved flattened, one entry per parameter name and setting
(`optim.state.<name>.exp_avg`, `optim.param_groups.<name>.lr`): the ranks of different stages
hold different parameter groups, which a nested `param_groups` list (one object, written once)
cannot say. A pipeline-split checkpoint therefore loads into the same layout, another one, or
one process. Checkpoints written before (nested optimizer state) still load: the reader follows
what the checkpoint's metadata holds.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

_STEP_DIR = re.compile(r"^step-(\d+)$")
TRAIN_STATE = "train_state.json"


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / TRAIN_STATE).is_file() and (child / ".metadata").is_file():
            found.append((int(match.group(1)), child))
    return max(found)[1] if found else None


def save_checkpoint(
    root: Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train_state: dict[str, Any],
    keep: int,
) -> Path:
    """Save a complete checkpoint of `step` (collective: every rank calls it)."""
    rank = dist.get_rank()
    final = checkpoint_path(root, step)
    partial = final.with_name(final.name + ".partial")
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(partial))
    (partial / "rng").mkdir(exist_ok=True)
    torch.save(torch.get_rng_state(), partial / "rng" / f"rank-{rank:05d}.pt")
    dist.barrier()
    if rank == 0:
        (partial / TRAIN_STATE).write_text(json.dumps({**train_state, "step": step}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        _prune(root, keep)
    dist.barrier()
    return final


def load_checkpoint(path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model and optimizer (in place) and this rank's RNG; returns the train state."""
    train_state = json.loads((path / TRAIN_STATE).read_text())
    options = StateDictOptions(flatten_optimizer_state_dict=_flat_optimizer_state(path))
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options
    )
    rng = path / "rng" / f"rank-{dist.get_rank():05d}.pt"
    if rng.is_file():  # absent when resuming on more ranks than saved: sampling is stateless anyway
        torch.set_rng_state(torch.load(rng, weights_only=True))
    return train_state


def _flat_optimizer_state(path: Path) -> bool:
    """Whether the checkpoint at `path` holds the optimizer state flattened (one entry per parameter
    name: this version's format) rather than nested (checkpoints written before pipelining)."""
    keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    # Nested groups list their parameters (`optim.param_groups.0.params`); flattened ones are keyed
    # by parameter name and hold only the settings (`optim.param_groups.<name>.lr`).
    return not any(key.startswith("optim.param_groups.") and key.endswith(".params") for key in keys)


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    steps = sorted((int(m.group(1)), child) for child in root.iterdir() if (m := _STEP_DIR.match(child.name)))
    for _, old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
