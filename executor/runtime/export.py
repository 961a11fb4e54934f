"""Export a training checkpoint as a Hugging Face model directory (safetensors + config.json):

    python -m executor.runtime.export --checkpoint CKPT --plan plan.json --out DIR \
        [--dtype bfloat16] [--max-shard-gb 5] [--hf-config ORIGINAL_DIR]

CKPT is one checkpoint (`step-00001000/`) or a `--checkpoint-dir` (its newest complete checkpoint).
Runs in one process, no GPU and no process group: distributed checkpointing (DCP) reassembles each
parameter from the ranks' shards as it loads. The model is exported one output file at a time, so
memory holds at most one file's worth of tensors (`--max-shard-gb`, default 5 as `save_pretrained`)
however large the model. Writes `model.safetensors`, or `model-0000i-of-0000N.safetensors` files
plus `model.safetensors.index.json`, and `config.json`; with `--hf-config DIR` (the checkpoint the
run started from, `--init-from`) its config.json is the base of the new one (token ids and the like
stay) and its tokenizer and generation files are copied. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` and with `train.py --init-from DIR`.
Only the model is exported, never the optimizer state.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from contract.plan_document import PlanError, RuntimePlan, load_plan
from executor.runtime import hf
from executor.runtime.checkpoint import latest_checkpoint
from executor.runtime.materialize import clean_name
from executor.runtime.models import build_model
from executor.runtime.safetensors_io import (
    WeightsError,
    plan_shards,
    shard_file_names,
    write_index,
    write_safetensors,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
MODEL_PREFIX = "model."
"""The trainer saves {"model": ..., "optim": ...}; DCP flattens the model's keys to `model.<name>`."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m executor.runtime.export",
        description="Write a training checkpoint as a Hugging Face safetensors model directory.",
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="a step-N checkpoint or a --checkpoint-dir")
    p.add_argument("--plan", type=Path, required=True, help="the plan the checkpoint was trained with")
    p.add_argument("--out", type=Path, required=True, help="output directory (created; files overwritten)")
    p.add_argument(
        "--dtype",
        choices=["auto", *DTYPES],
        default="auto",
        help="tensor dtype in the files (auto: as stored in the checkpoint, float32 master weights: "
        "lossless; bfloat16 halves the size for serving)",
    )
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest file, GB (10^9 bytes; default 5)")
    p.add_argument("--hf-config", type=Path, help="directory of the original HF checkpoint: base config.json")
    args = p.parse_args(argv)
    if args.max_shard_gb <= 0:
        p.error("--max-shard-gb must be positive")
    return args


def resolve_checkpoint(path: Path) -> Path:
    if (path / ".metadata").is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise WeightsError(
            f"{path}: not a checkpoint (no .metadata) nor a directory holding step-N checkpoints"
        )
    return found


def export(
    checkpoint: Path,
    plan: RuntimePlan,
    out: Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = 5 * 10**9,
    hf_config: Path | None = None,
) -> dict[str, object]:
    """Export `checkpoint` (one step directory) to `out`; returns a summary."""
    t0 = time.perf_counter()
    model_cfg = plan.model
    if model_cfg.architecture not in ("llama", "gpt2"):
        raise WeightsError(
            "export writes the built-in llama and gpt2 architectures; the plan's model is "
            f"{model_cfg.architecture!r}"
        )
    base = None
    if hf_config is not None:
        base = hf.read_config(hf_config)
        hf.check_config(base, model_cfg, seq_len=plan.training.seq_len, where=str(hf_config / "config.json"))
    # The parameters to write: the model's own (a tied weight once), in the model's order.
    model = build_model(model_cfg, seq_len=plan.training.seq_len)
    # The parameters and the buffers a Hugging Face checkpoint holds too (DeepSeek-V3's router bias).
    tensors_of = dict(model.named_parameters()) | {
        n: b for n, b in model.named_buffers() if n.endswith(hf.LOADED_BUFFERS)
    }
    wanted = [clean_name(n) for n in tensors_of]
    stored = _stored_tensors(checkpoint)
    missing = [n for n in wanted if n not in stored]
    if missing:
        raise WeightsError(
            f"{checkpoint}: lacks model parameters {missing[:4]}{' ...' if len(missing) > 4 else ''}: "
            "was it written with another plan's model?"
        )
    shapes = tensors_of
    for name in wanted:
        size, _, key = stored[name]
        if tuple(size) != tuple(shapes[name].shape):
            raise WeightsError(
                f"{checkpoint}: {key} has shape {list(size)}, the plan's model has {list(shapes[name].shape)}"
            )
    out_dtypes = {n: stored[n][1] if dtype == "auto" else DTYPES[dtype] for n in wanted}
    groups = plan_shards(((n, shapes[n].numel() * out_dtypes[n].itemsize) for n in wanted), max_shard_bytes)
    files = shard_file_names(len(groups))
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for names, file in zip(groups, files, strict=True):
        # One file's tensors at a time: DCP reads just these keys' chunks from every rank's shard.
        state = {stored[n][2]: torch.empty(tuple(stored[n][0]), dtype=stored[n][1]) for n in names}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
        tensors = {}
        for name in names:
            # One tensor, or one per expert of a stacked parameter, in the checkpoint's layout.
            for target in hf.export_names(model_cfg, name, config=base):
                tensor = hf.to_checkpoint(state[stored[name][2]], target)
                tensors[target.name] = tensor.to(out_dtypes[name]).contiguous()
                weight_map[target.name] = file
                total += tensors[target.name].numel() * tensors[target.name].element_size()
        write_safetensors(out / file, tensors, metadata={"format": "pt"})
        del state, tensors
    if len(files) > 1:
        write_index(out, weight_map, total_size=total)
    written_dtypes = {str(d).removeprefix("torch.") for d in out_dtypes.values()}
    config = hf.export_config(model_cfg, dtype=sorted(written_dtypes)[0], base=base)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    copied = []
    if hf_config is not None:
        for name in TOKENIZER_FILES:
            if (hf_config / name).is_file():
                shutil.copyfile(hf_config / name, out / name)
                copied.append(name)
    return {
        "checkpoint": str(checkpoint),
        "out": str(out),
        "tensors": len(weight_map),
        "files": files,
        "bytes": total,
        "dtype": sorted(written_dtypes),
        "copied": copied,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _stored_tensors(checkpoint: Path) -> dict[str, tuple[torch.Size, torch.dtype, str]]:
    """The model tensors in a DCP checkpoint: clean parameter name -> (size, dtype, DCP key)."""
    try:
        metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    except (OSError, ValueError, RuntimeError) as exc:
        raise WeightsError(f"{checkpoint}: cannot read the checkpoint metadata ({exc})") from None
    found = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not key.startswith(MODEL_PREFIX) or not hasattr(meta, "size"):
            continue
        found[clean_name(key[len(MODEL_PREFIX) :])] = (meta.size, meta.properties.dtype, key)
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = load_plan(args.plan)
        checkpoint = resolve_checkpoint(args.checkpoint)
        summary = export(
            checkpoint,
            plan,
            args.out,
            dtype=args.dtype,
            max_shard_bytes=int(args.max_shard_gb * 10**9),
            hf_config=args.hf_config,
        )
    except (PlanError, WeightsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    files = summary["files"]
    print(
        f"exported {summary['checkpoint']} -> {summary['out']}: {summary['tensors']} tensors, "
        f"{summary['bytes'] / 2**20:,.1f} MiB {'/'.join(summary['dtype'])} in {len(files)} file(s), "  # type: ignore[arg-type]
        f"{summary['seconds']} s" + (f"; copied {', '.join(summary['copied'])}" if summary["copied"] else "")  # type: ignore[arg-type]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
