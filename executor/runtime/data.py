"""Token batches: synthetic, or sampled from a flat token file, deterministically per rank.

Sampling is *stateless*: sequence i of step s comes from a generator seeded by (seed, s, i), where
i = (micro * dp_size + dp_rank) * micro_batch_size + j numbers the global batch. So the data
position to resume from is just the step number, every rank draws only its own sequences, and
the global batch of a step does not depend on how it is split into ranks and micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

_FILE_DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32}
_MIN_PERIOD, _MAX_PERIOD = 8, 64


class DataError(ValueError):
    """A token file that cannot feed this model (missing, too short, ids out of range)."""


def _sequence_generator(seed: int, step: int, index: int) -> torch.Generator:
    # Distinct odd multipliers keep (step, index) pairs from colliding for realistic sizes.
    return torch.Generator().manual_seed((seed * 0x9E3779B1 + step * 0x85EBCA77 + index * 0xC2B2AE3D) % 2**63)


@dataclass(frozen=True, slots=True)
class BatchIndex:
    """Which part of the global batch a micro-batch is."""

    step: int
    """Optimizer step, 1-based."""
    micro: int
    """Micro-batch within the step, 0-based."""
    dp_rank: int
    """This rank's data-parallel index."""
    dp_size: int
    """Data-parallel ranks."""
    batch_size: int
    """Sequences per micro-batch."""

    def sequence_ids(self) -> range:
        first = (self.micro * self.dp_size + self.dp_rank) * self.batch_size
        return range(first, first + self.batch_size)


class SyntheticTokens:
    """Learnable synthetic text. Each sequence repeats a random motif (length 8..64) whose tokens
    follow a Zipf distribution over the vocabulary: a model first learns the skewed unigram
    distribution (loss drops from ~log(vocab) within tens of steps), then to copy the motif."""

    description = "synthetic (repeated Zipf motifs)"

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, zipf_s: float = 1.1) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
        self.probs = (ranks**-zipf_s / (ranks**-zipf_s).sum()).float()
        self.max_period = max(1, min(_MAX_PERIOD, seq_len))

    def batch(self, index: BatchIndex) -> torch.Tensor:
        """int64 tokens [batch_size, seq_len + 1] (inputs are [:, :-1], targets [:, 1:])."""
        rows = []
        for i in index.sequence_ids():
            g = _sequence_generator(self.seed, index.step, i)
            period = int(
                torch.randint(min(_MIN_PERIOD, self.max_period), self.max_period + 1, (1,), generator=g)
            )
            motif = torch.multinomial(self.probs, period, replacement=True, generator=g)
            rows.append(motif.repeat(-(-(self.seq_len + 1) // period))[: self.seq_len + 1])
        return torch.stack(rows)


class TokenFile:
    """Random windows of a flat binary file of token ids (uint16 or uint32, native byte order),
    memory-mapped: only the windows read are paged in."""

    def __init__(self, path: str | Path, *, dtype: str, vocab_size: int, seq_len: int, seed: int) -> None:
        if dtype not in _FILE_DTYPES:
            raise DataError(f"--data-dtype {dtype!r}: use uint16 or uint32")
        path = Path(path)
        if not path.is_file():
            raise DataError(f"--data {str(path)!r}: no such file")
        itemsize = 2 if dtype == "uint16" else 4
        size = path.stat().st_size
        if size % itemsize:
            raise DataError(
                f"--data {str(path)!r}: {size} bytes is not a whole number of {dtype} tokens; "
                "is --data-dtype right?"
            )
        self.num_tokens = size // itemsize
        if self.num_tokens < seq_len + 1:
            raise DataError(
                f"--data {str(path)!r}: {self.num_tokens} tokens, fewer than one sequence of {seq_len + 1}"
            )
        self.path, self.dtype, self.vocab_size, self.seq_len, self.seed = (
            path,
            dtype,
            vocab_size,
            seq_len,
            seed,
        )
        self.description = f"{path.name} ({self.num_tokens:,} {dtype} tokens)"
        # shared=False maps the file privately (copy-on-write, read-only files are fine).
        self.tokens = torch.from_file(
            str(path), shared=False, size=self.num_tokens, dtype=_FILE_DTYPES[dtype]
        )

    def batch(self, index: BatchIndex) -> torch.Tensor:
        window = self.seq_len + 1
        rows = []
        for i in index.sequence_ids():
            g = _sequence_generator(self.seed, index.step, i)
            offset = int(torch.randint(0, self.num_tokens - window + 1, (1,), generator=g))
            rows.append(self.tokens[offset : offset + window].to(torch.int64))
        batch = torch.stack(rows)
        top = int(batch.max())
        if top >= self.vocab_size:
            raise DataError(
                f"--data {str(self.path)!r}: token id {top} is outside the model's vocabulary of "
                f"{self.vocab_size}; was the file tokenised for another model, or is --data-dtype wrong?"
            )
        return batch
