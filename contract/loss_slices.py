"""How many token slices the loss runs in, declared once for the planner and the profiler.

The runtime runs the output projection and cross-entropy over `config.loss_chunks` token slices,
each computing its gradients at once (executor/runtime/loss.py). The planner slices every plan's loss
by this rule (planner/cost/memory.py prices the slices), and the profiler slices the loss of the steps
it measures by the same rule, so that a calibration measures steps shaped as plans run: an unsliced
128k-vocabulary loss would hold most of a short model's transient memory, which no plan does.
"""

from __future__ import annotations

import math

LOSS_SLICE_BYTES_PER_ELEMENT = {2: 6.0, 4: 4.0}
"""Bytes alive per (token x vocab entry) of one loss slice, by compute-dtype size: bf16 logits and
their fp32 copy, which becomes the softmax and the gradient in place; in fp32 the logits themselves
(the runtime's chunked loss, executor/runtime/loss.py; measured in bench/RESULTS.md)."""

LOSS_SLICE_TARGET_BYTES = float(1 << 30)
"""The loss is sliced until one slice's logits take at most this much (1 GiB): a few percent of a
datacenter GPU, while a slice of a 128k vocabulary still has ~800 tokens, enough for an efficient
output-projection GEMM."""


def loss_chunks_for(tokens: int, vocab_size: int, compute_bytes: int) -> int:
    """Slices the loss of a `tokens`-token micro-batch needs to keep one slice under the target."""
    if vocab_size <= 0:
        return 1
    whole = tokens * vocab_size * LOSS_SLICE_BYTES_PER_ELEMENT[compute_bytes]
    return max(1, min(tokens, math.ceil(whole / LOSS_SLICE_TARGET_BYTES)))
