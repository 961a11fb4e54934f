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

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def sequences(self) -> int:
        return self.global_batch_sequences or self.global_batch_tokens // self.seq_len
