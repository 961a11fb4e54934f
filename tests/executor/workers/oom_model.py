"""A model factory whose backward asks for an impossible allocation: the trainer's OOM path, for real.

`--model-factory tests.executor.workers.oom_model:build` builds the plan's Llama; on the rank named by
OOM_RANK (default 0), at the optimizer step OOM_STEP (default 2, one micro-batch per step), the
backward pass allocates a 1 PiB tensor, which the allocator refuses as it would any too-large request.
"""

from __future__ import annotations

import os

import torch

from contract.model_config import ModelConfig
from executor.runtime.models import Llama

HUGE_ELEMENTS = 2**48  # 1 PiB of bytes: no machine has it, so the allocation fails at once


class _AllocateInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        torch.empty(HUGE_ELEMENTS, dtype=torch.uint8, device=grad.device)
        return grad


class OomLlama(Llama):
    def __init__(self, cfg: ModelConfig, *, seq_len: int) -> None:
        super().__init__(cfg, seq_len=seq_len)
        self.calls = 0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = super().forward(tokens)
        self.calls += 1
        on_this_rank = os.environ.get("RANK", "0") == os.environ.get("OOM_RANK", "0")
        if on_this_rank and self.calls == int(os.environ.get("OOM_STEP", "2")):
            logits = _AllocateInBackward.apply(logits)
        return logits


def build(cfg: ModelConfig) -> OomLlama:
    with torch.device("meta"):
        return OomLlama(cfg, seq_len=cfg.max_seq_len)
