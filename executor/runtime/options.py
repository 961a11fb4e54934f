"""The trainer's run options, declared once: each field of `RunOptions` is one command-line flag.

The flag is the field's name with dashes (`eval_every` -> `--eval-every`); its type, default and
choices come from the annotation (`bool` is a switch, `Literal[...]` lists the choices, `X | None`
is optional); `help` and `metavar` ride in the field's metadata (`option(...)`). Adding an option is
adding one field. Standard library only: a launch bundle's trainer reads it without the planner.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

_NO_DEFAULT: Any = dataclasses.MISSING


def option(default: Any = _NO_DEFAULT, *, help: str | None = None, metavar: str | None = None) -> Any:
    """A `RunOptions` field: its default (none: the flag is required), help text and metavar."""
    return field(default=default, metadata={"help": help, "metavar": metavar})


@dataclass(slots=True)
class RunOptions:
    """What one training run is asked to do, beyond the plan (`python -m executor.runtime.train --help`)."""

    plan: str = option(help="plan JSON (as downloaded with the launcher)")
    steps: int = option(20, help="optimizer steps to run in total (default 20)")
    data: str | None = option(
        None,
        metavar="PATH",
        help="training data: a dataset directory written by `fsdp-planner prepare-data` (index.json + "
        "token shards), or a flat binary token file. Required unless --synthetic-data",
    )
    data_dtype: Literal["uint16", "uint32"] | None = option(
        None, help="token id type of a flat --data file (default uint16; a dataset directory states its own)"
    )
    synthetic_data: bool = option(
        False,
        help="train on synthetic tokens instead of --data: a rehearsal of speed and memory, not training",
    )
    eval_every: int = option(
        0,
        metavar="N",
        help="every N steps (and at the last) log the mean loss on the held-out eval split (0: never)",
    )
    eval_batches: int = option(
        10,
        metavar="K",
        help="global batches of eval sequences per evaluation (default 10; the same sequences each time)",
    )
    tensorboard: Path | None = option(None, metavar="DIR", help="also log scalars to TensorBoard here")  # noqa: RUF009 (`option` is `field`)
    wandb_project: str | None = option(None, metavar="NAME", help="also log to this Weights & Biases project")
    checkpoint_dir: Path | None = option(None, help="where distributed checkpoints go")  # noqa: RUF009 (`option` is `field`)
    checkpoint_every: int = option(0, help="save every N steps (0: only at the end)")
    keep_checkpoints: int = option(2, help="complete checkpoints to keep (0: all)")
    resume: bool = option(False, help="continue from the newest checkpoint in --checkpoint-dir")
    metrics_file: Path | None = option(  # noqa: RUF009 (`option` is `field`)
        None, help="append per-step JSON lines here (rank 0; OOM records: every rank)"
    )
    seed: int = option(0, help="initial weights and data sampling")
    lr: float = option(3e-4, help="peak learning rate")
    min_lr_ratio: float = option(0.1, help="final lr as a fraction of --lr")
    warmup: int | None = option(None, help="linear warmup steps (default: 10%% of --steps, at most 100)")
    weight_decay: float = option(0.1)
    max_grad_norm: float = option(1.0, help="gradient clipping (0: off)")
    model_factory: str | None = option(None, help="package.module:function returning your nn.Module")
    init_from: Path | None = option(  # noqa: RUF009 (`option` is `field`)
        None,
        metavar="DIR",
        help="start from a Hugging Face checkpoint: config.json + model.safetensors (or shards with "
        "model.safetensors.index.json) of the plan's model; a checkpoint found by --resume wins",
    )
    device: Literal["auto", "cuda", "cpu"] = option("auto")
    precision: Literal["auto", "plan", "fp32"] = option(
        "auto",
        help="auto: the plan's dtypes on GPU, float32 on CPU; plan: always the plan's; fp32: always float32",
    )
    engine: Literal["auto", "simple_fsdp", "fsdp2"] = option(
        "auto", help="auto: SimpleFSDP+compile when the plan compiles, else FSDP2"
    )
    no_compile: bool = option(False, help="run SimpleFSDP eagerly (debugging)")
    compile_backend: str = option("inductor", help="torch.compile backend (default inductor)")
    memory_every: int = option(25, help="CPU only: profile memory every N steps")
    timing_warmup: int = option(
        1,
        help="leading steps left out of the closing summary's median step time (compilation, allocator "
        "growth; default 1); `fsdp-planner validate` passes its --warmup so both report one number",
    )
    max_memory_gib: float | None = option(
        None,
        help="CUDA only: cap each process's GPU memory at this many GiB (rehearse the plan for a smaller "
        "GPU; going over it is an out-of-memory exit)",
    )

    def problem(self) -> str | None:
        """What makes these options unusable together, in the words of a command-line error; None: fine."""
        if self.max_memory_gib is not None and self.max_memory_gib <= 0:
            return "--max-memory-gib must be positive"
        if self.steps < 1:
            return "--steps must be at least 1"
        if self.resume and self.checkpoint_dir is None:
            return "--resume needs --checkpoint-dir"
        if self.eval_every < 0 or self.eval_batches < 1:
            return "--eval-every must be >= 0 and --eval-batches >= 1"
        return None

    def with_defaults(self) -> RunOptions:
        """The defaults that depend on other options filled in (`warmup`: 10% of `steps`, at most 100)."""
        if self.warmup is None:
            self.warmup = min(100, max(1, self.steps // 10))
        return self


def flag(name: str) -> str:
    """The command-line flag of a `RunOptions` field."""
    return "--" + name.replace("_", "-")


def _argument(annotation: Any, f: dataclasses.Field[Any]) -> dict[str, Any]:
    """`add_argument`'s keywords for one field, from its annotation, default and metadata."""
    kwargs: dict[str, Any] = {k: v for k, v in f.metadata.items() if v is not None}
    if annotation is bool:
        return {"action": "store_true", **kwargs}
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [a for a in args if a is not type(None)]
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        kwargs["choices"] = list(args)
    elif annotation is not str:
        kwargs["type"] = annotation
    if f.default is _NO_DEFAULT:
        kwargs["required"] = True
    elif f.default is not None:
        kwargs["default"] = f.default
    return kwargs


def add_options(parser: argparse.ArgumentParser, cls: type = RunOptions) -> argparse.ArgumentParser:
    """One flag per field of `cls`, in field order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        parser.add_argument(flag(f.name), **_argument(hints[f.name], f))
    return parser


def parse_options(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> RunOptions:
    """`argv` read by `parser` (built by `add_options`) into checked `RunOptions`; a problem exits 2."""
    options = RunOptions(**vars(parser.parse_args(argv)))
    problem = options.problem()
    if problem:
        parser.error(problem)
    return options.with_defaults()
