"""What one optimizer step processes, declared once.

The runtime reads it from a plan (contract.plan_document); the planner's request spec
`planner.specs.TrainingSpec` takes its fields from here, adding the bounds a request must keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from contract.fields import DOCUMENT_CONFIG, AtLeast, check_fields

Precision = Literal["bf16", "fp32"]
Optimizer = Literal["adamw", "sgd"]
StateDType = Literal["float32", "bfloat16"]
"""The dtype of what the optimizer updates: parameters, gradients and optimizer states."""

STATE_DTYPE_NEEDS_BF16 = (
    "state_dtype: bfloat16 (pure bf16 training) keeps parameters, gradients and optimizer states in bf16, "
    "so it needs precision bf16; set training.precision to bf16 or training.state_dtype to float32"
)



def precision_label(precision: str, state_dtype: str) -> str:
    """How a plan's precision reads (CLI, dashboard): `bf16`, `fp32`, or `bf16 pure (no fp32 master)`."""
    return f"{precision} pure (no fp32 master)" if state_dtype == "bfloat16" else precision


DERIVED_TRAINING = ("global_batch_sequences",)
"""Fields the planner derives (a plan carries them, a request does not)."""


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    """What one optimizer step processes and how numbers are represented."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    seq_len: Annotated[int, AtLeast(1)]
    """Tokens per sequence."""
    global_batch_tokens: Annotated[int, AtLeast(1)]
    """Tokens per optimizer step over the whole cluster (a multiple of `seq_len`)."""
    precision: Precision = "bf16"
    """`bf16`: bf16 compute with fp32 master weights and fp32 gradient reduction; `fp32`: all fp32."""
    optimizer: Optimizer = "adamw"
    """`adamw` (two fp32 states per parameter) or `sgd` (momentum: one state)."""
    global_batch_sequences: int = 0
    """Sequences per optimizer step (a plan states it; 0: global_batch_tokens / seq_len)."""
    state_dtype: StateDType = "float32"
    """What the optimizer updates: `float32` parameters, gradients and optimizer states beside the
    compute copies (mixed precision: 4 + 4 + 8 bytes per parameter with AdamW); `bfloat16`: pure
    bf16 training, as some trainers run, with parameters, gradients (reduced in bf16) and AdamW's
    states in bf16 and no fp32 master (2 + 2 + 4 bytes): half the memory and optimizer traffic, at
    the cost of updates smaller than bf16 resolves being lost. Needs precision `bf16`."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.state_dtype == "bfloat16" and self.precision != "bf16":
            raise ValueError(STATE_DTYPE_NEEDS_BF16)

    @property
    def sequences(self) -> int:
        return self.global_batch_sequences or self.global_batch_tokens // self.seq_len
