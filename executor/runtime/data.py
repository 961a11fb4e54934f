"""Token batches for the trainer: a prepared dataset directory, a flat token file, or synthetic tokens.

Dataset directory (format `fsdp-planner-tokens`, version 1; `fsdp-planner prepare-data` writes it):

    my-dataset/
      index.json          what the shards hold (below); written last: a directory without it is unfinished
      train-00000.bin     raw token ids, little-endian uint16 or uint32, no header, no padding
      train-00001.bin
      eval-00000.bin      the held-out split: whole documents that are in no train shard

    index.json
      {"format": "fsdp-planner-tokens", "version": 1,
       "dtype": "uint16",                  uint16 (vocabularies up to 65,536) or uint32
       "byte_order": "little",
       "tokenizer": "gpt2",                the name or path given to prepare-data ("bytes": built-in)
       "vocab_size": 50257,                every id is below it; the model's vocab_size must be >= it
       "eos_token_id": 50256,              the document separator: follows every document
       "splits": {
         "train": {"documents": 9000, "tokens": 41234567,
                   "shards": [{"file": "train-00000.bin", "tokens": 33554432}, ...]},
         "eval":  {"documents": 91, "tokens": 412345, "shards": [{"file": "eval-00000.bin", ...}]}},
       ...}                                provenance fields (sources, eval_fraction, ...) are ignored here

A split is one stream of tokens: the documents, each followed by `eos_token_id`, concatenated, then
cut into shards for storage only (a document may continue in the next shard). A shard file is
exactly `tokens x itemsize` bytes. The runtime maps shards with `torch.from_file` (no NumPy), lazily,
and reads only the sequences it trains on: nothing is loaded whole.

Sampling is *stateless*. A split of T tokens holds N = (T - 1) // seq_len sequences of seq_len + 1
tokens at offsets k x seq_len (neighbours share one token, so every token is a target once per
epoch; sequences cross document and shard boundaries). Sequence i of step s, where
i = (micro x dp_size + dp_rank) x micro_batch_size + j numbers the step's global batch of S
sequences, is sequence g = (s - 1) x S + i of the run: epoch g // N, read in a pseudo-random
permutation of the N sequences drawn from (seed, epoch) (a Feistel network: O(1) memory, whatever
N). So each epoch reads every sequence once, the data position to resume from is just the step,
every rank reads only its own sequences, and the global batch of a step does not depend on how it
is split into ranks and micro-batches. Evaluation batch b (1-based) of S sequences takes sequences
(b - 1) x S + i of the eval split, spread evenly over it: the same sequences at every evaluation.

A flat token file (`--data tokens.bin`, `--data-dtype uint16|uint32`, native byte order) is read the
same way, as a dataset of one train shard without an eval split.

Synthetic tokens (`SyntheticTokens`, `--synthetic-data`) are for rehearsals: sequence i of step s
comes from a generator seeded by (seed, s, i); evaluation uses steps -1, -2, ... which training never
draws.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from contract.token_format import FORMAT, FORMAT_VERSION, INDEX

DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32}
ITEMSIZE = {"uint16": 2, "uint32": 4}
_MIN_PERIOD, _MAX_PERIOD = 8, 64
_MASK64 = (1 << 64) - 1


class DataError(ValueError):
    """Data that cannot feed this model (missing, unfinished, too short, ids out of range)."""


def _sequence_generator(seed: int, step: int, index: int) -> torch.Generator:
    # Distinct odd multipliers keep (step, index) pairs from colliding for realistic sizes.
    return torch.Generator().manual_seed((seed * 0x9E3779B1 + step * 0x85EBCA77 + index * 0xC2B2AE3D) % 2**63)


@dataclass(frozen=True, slots=True)
class BatchIndex:
    """Which part of the global batch a micro-batch is."""

    step: int
    """Optimizer step, 1-based (for evaluation: the eval batch, 1-based)."""
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


class TokenSource(Protocol):
    """What the trainer reads batches from."""

    description: str
    synthetic: bool
    has_eval: bool

    def batch(self, index: BatchIndex) -> torch.Tensor: ...

    def eval_batch(self, index: BatchIndex, *, batches: int) -> torch.Tensor: ...


class SyntheticTokens:
    """Learnable synthetic text. Each sequence repeats a random motif (length 8..64) whose tokens
    follow a Zipf distribution over the vocabulary: a model first learns the skewed unigram
    distribution (loss drops from ~log(vocab) within tens of steps), then to copy the motif."""

    description = "SYNTHETIC tokens (repeated Zipf motifs; --synthetic-data)"
    synthetic = True
    has_eval = True

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, zipf_s: float = 1.1) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
        self.probs = (ranks**-zipf_s / (ranks**-zipf_s).sum()).float()
        self.max_period = max(1, min(_MAX_PERIOD, seq_len))

    def batch(self, index: BatchIndex) -> torch.Tensor:
        """int64 tokens [batch_size, seq_len + 1] (inputs are [:, :-1], targets [:, 1:])."""
        return self._rows(index.step, index)

    def eval_batch(self, index: BatchIndex, *, batches: int) -> torch.Tensor:
        """Held-out sequences: drawn for steps -1, -2, ..., which training never uses."""
        return self._rows(-index.step, index)

    def _rows(self, step: int, index: BatchIndex) -> torch.Tensor:
        rows = []
        for i in index.sequence_ids():
            g = _sequence_generator(self.seed, step, i)
            period = int(
                torch.randint(min(_MIN_PERIOD, self.max_period), self.max_period + 1, (1,), generator=g)
            )
            motif = torch.multinomial(self.probs, period, replacement=True, generator=g)
            rows.append(motif.repeat(-(-(self.seq_len + 1) // period))[: self.seq_len + 1])
        return torch.stack(rows)


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def permute(x: int, n: int, key: int) -> int:
    """Position `x` of a pseudo-random permutation of range(n) chosen by `key`: a 4-round Feistel
    network on the smallest even-bit domain >= n, walking the cycle until it lands inside range(n)
    (at most ~4 rounds on average). Stateless and O(1) memory, for any n."""
    if not 0 <= x < n:
        raise ValueError(f"permute: {x} is outside range({n})")
    if n == 1:
        return 0
    half = ((n - 1).bit_length() + 1) // 2
    mask = (1 << half) - 1
    while True:
        left, right = x >> half, x & mask
        for round_ in range(4):
            left, right = right, left ^ (_mix64(key ^ (round_ << 60) ^ right) & mask)
        x = (left << half) | right
        if x < n:
            return x


@dataclass(frozen=True, slots=True)
class Shard:
    path: Path
    tokens: int


class TokenStream:
    """One split: its shards as one stream of tokens, memory-mapped shard by shard on first use."""

    def __init__(self, name: str, shards: list[Shard], *, dtype: str, vocab_size: int, hint: str) -> None:
        self.name, self.dtype, self.vocab_size, self.hint = name, dtype, vocab_size, hint
        self.shards = [s for s in shards if s.tokens > 0]
        self.starts: list[int] = []
        total = 0
        for shard in self.shards:
            self.starts.append(total)
            total += shard.tokens
        self.num_tokens = total
        self._maps: dict[int, torch.Tensor] = {}

    def _map(self, k: int) -> torch.Tensor:
        if k not in self._maps:
            shard = self.shards[k]
            # shared=False maps the file privately (copy-on-write; read-only files are fine): only the
            # pages a sequence touches are read.
            self._maps[k] = torch.from_file(
                str(shard.path), shared=False, size=shard.tokens, dtype=DTYPES[self.dtype]
            )
        return self._maps[k]

    def read(self, offset: int, length: int) -> torch.Tensor:
        """int64 tokens [offset, offset + length) of the stream, checked against the vocabulary."""
        k = bisect.bisect_right(self.starts, offset) - 1
        pieces = []
        while length > 0:
            start = offset - self.starts[k]
            take = min(length, self.shards[k].tokens - start)
            piece = self._map(k)[start : start + take].to(torch.int64)
            top = int(piece.max())
            if top >= self.vocab_size:
                where = int(piece.argmax()) + start
                raise DataError(
                    f"{self.shards[k].path}: token id {top} at position {where:,} is not below "
                    f"{self.hint}; was it tokenised for another model, is the shard corrupt, or is the "
                    "dtype wrong? Prepare the data with the model's tokenizer (`fsdp-planner prepare-data`)"
                )
            pieces.append(piece)
            offset, length, k = offset + take, length - take, k + 1
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


class TokenDataset:
    """Sequences sampled from token streams (see the module docstring): a prepared dataset directory
    (`from_directory`) or a flat token file (`from_flat_file`); `open_dataset` picks."""

    synthetic = False

    def __init__(
        self,
        train: TokenStream,
        eval_split: TokenStream | None,
        *,
        seq_len: int,
        seed: int,
        sequences_per_step: int,
        description: str,
    ) -> None:
        if sequences_per_step < 1:
            raise ValueError("sequences_per_step must be positive")
        self.train, self.eval = train, eval_split
        self.seq_len, self.seed, self.sequences_per_step = seq_len, seed, sequences_per_step
        self.description = description
        self.index: dict[str, Any] | None = None
        """The dataset's index.json (None for a flat file)."""
        for stream in (train, eval_split):
            if stream is not None and stream.num_tokens < seq_len + 1:
                raise DataError(
                    f"{description}: the {stream.name} split holds {stream.num_tokens:,} tokens, fewer than "
                    f"one sequence of seq_len + 1 = {seq_len + 1}; prepare more text (or a larger "
                    "--eval-fraction for the eval split), or plan a shorter --seq-len"
                )
        self.train_sequences = (train.num_tokens - 1) // seq_len
        self.eval_sequences = (eval_split.num_tokens - 1) // seq_len if eval_split is not None else 0

    @property
    def has_eval(self) -> bool:
        return self.eval is not None

    @property
    def steps_per_epoch(self) -> float:
        return self.train_sequences / self.sequences_per_step

    def sequence_number(self, index: BatchIndex, i: int) -> int:
        """g: the sequence's place in the run (see the module docstring)."""
        return (index.step - 1) * self.sequences_per_step + i

    def train_offset(self, g: int) -> int:
        """Where sequence g of the run starts in the train stream."""
        n = self.train_sequences
        epoch, position = divmod(g, n)
        key = _mix64(_mix64(self.seed & _MASK64) ^ epoch)
        return permute(position, n, key) * self.seq_len

    def batch(self, index: BatchIndex) -> torch.Tensor:
        """int64 tokens [batch_size, seq_len + 1] of a training micro-batch."""
        window = self.seq_len + 1
        rows = [self.train.read(self.train_offset(self.sequence_number(index, i)), window)
                for i in index.sequence_ids()]
        return torch.stack(rows)

    def eval_offset(self, g: int, *, total: int) -> int:
        """Where eval sequence g of `total` starts: spread evenly over the eval split."""
        n = self.eval_sequences
        k = g * n // total if total <= n else g % n
        return k * self.seq_len

    def eval_batch(self, index: BatchIndex, *, batches: int) -> torch.Tensor:
        """int64 tokens of eval batch `index.step` (1-based) of `batches`, from the held-out split."""
        if self.eval is None:
            raise DataError(f"{self.description}: there is no eval split to evaluate on")
        total = batches * self.sequences_per_step
        window = self.seq_len + 1
        rows = [
            self.eval.read(self.eval_offset(self.sequence_number(index, i), total=total), window)
            for i in index.sequence_ids()
        ]
        return torch.stack(rows)

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def from_flat_file(
        cls, path: Path, *, dtype: str, vocab_size: int, seq_len: int, seed: int, sequences_per_step: int
    ) -> TokenDataset:
        if dtype not in DTYPES:
            raise DataError(f"--data-dtype {dtype!r}: use uint16 or uint32")
        size = path.stat().st_size
        if size % ITEMSIZE[dtype]:
            raise DataError(
                f"--data {str(path)!r}: {size} bytes is not a whole number of {dtype} tokens; "
                "is --data-dtype right?"
            )
        tokens = size // ITEMSIZE[dtype]
        stream = TokenStream(
            "train",
            [Shard(path, tokens)],
            dtype=dtype,
            vocab_size=vocab_size,
            hint=f"the model's vocab_size {vocab_size:,}",
        )
        return cls(
            stream,
            None,
            seq_len=seq_len,
            seed=seed,
            sequences_per_step=sequences_per_step,
            description=f"{path.name} ({tokens:,} {dtype} tokens, flat file)",
        )

    @classmethod
    def from_directory(
        cls,
        directory: Path,
        *,
        vocab_size: int,
        seq_len: int,
        seed: int,
        sequences_per_step: int,
        dtype: str | None = None,
    ) -> TokenDataset:
        index = read_index(directory)
        if dtype is not None and dtype != index["dtype"]:
            raise DataError(
                f"--data-dtype {dtype} contradicts {directory / INDEX}, which says the shards hold "
                f"{index['dtype']} tokens; leave --data-dtype out (it is for flat token files)"
            )
        data_vocab = index["vocab_size"]
        if data_vocab > vocab_size:
            raise DataError(
                f"{directory}: tokenised with {index['tokenizer']!r} (vocabulary {data_vocab:,}), larger "
                f"than the plan's model vocabulary of {vocab_size:,}: its token ids would index past the "
                "embedding. Prepare the data with the model's own tokenizer, or plan a model whose "
                f"vocab_size is at least {data_vocab:,}"
            )
        streams = {}
        for name, split in index["splits"].items():
            shards = [Shard(directory / s["file"], s["tokens"]) for s in split["shards"]]
            streams[name] = TokenStream(
                name,
                shards,
                dtype=index["dtype"],
                # The tokenizer's vocabulary is the tighter bound: an id past it is a corrupt shard.
                vocab_size=data_vocab,
                hint=f"the vocab_size {data_vocab:,} in index.json (tokenizer {index['tokenizer']!r})",
            )
        train = streams["train"]
        description = (
            f"{directory} ({train.num_tokens:,} train tokens in {len(train.shards)} shard(s)"
            + (f", {streams['eval'].num_tokens:,} eval tokens" if "eval" in streams else ", no eval split")
            + f"; {index['dtype']}, tokenizer {index['tokenizer']!r}, vocabulary {data_vocab:,})"
        )
        dataset = cls(
            train,
            streams.get("eval"),
            seq_len=seq_len,
            seed=seed,
            sequences_per_step=sequences_per_step,
            description=description,
        )
        dataset.index = index
        return dataset


def open_dataset(
    path: str | Path,
    *,
    vocab_size: int,
    seq_len: int,
    seed: int,
    sequences_per_step: int,
    dtype: str | None = None,
) -> TokenDataset:
    """`--data PATH`: a prepared dataset directory (or its index.json), or a flat token file
    (`dtype` then defaults to uint16)."""
    path = Path(os.path.normpath(os.path.abspath(path)))  # as shown in logs and checkpoints
    if path.name == INDEX and path.is_file():
        path = path.parent
    if path.is_dir():
        return TokenDataset.from_directory(
            path, vocab_size=vocab_size, seq_len=seq_len, seed=seed, sequences_per_step=sequences_per_step,
            dtype=dtype,
        )
    if not path.exists():
        raise DataError(
            f"--data {str(path)!r}: no such file or directory (a dataset directory written by "
            "`fsdp-planner prepare-data`, or a flat token file); is the path visible on every node?"
        )
    return TokenDataset.from_flat_file(
        path, dtype=dtype or "uint16", vocab_size=vocab_size, seq_len=seq_len, seed=seed,
        sequences_per_step=sequences_per_step,
    )


def read_index(directory: Path) -> dict[str, Any]:
    """index.json of a dataset directory, validated (shard files present and of the stated size)."""
    path = directory / INDEX
    if not path.is_file():
        raise DataError(
            f"--data {str(directory)!r}: no {INDEX} there. A dataset directory is written by "
            "`fsdp-planner prepare-data` (index.json comes last: without it the preparation did not "
            "finish; run it again); a flat token file is passed as the file itself"
        )
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read it as JSON ({exc})") from None

    def bad(what: str) -> DataError:
        return DataError(f"{path}: {what}; re-run `fsdp-planner prepare-data` to write it again")

    if not isinstance(index, dict) or index.get("format") != FORMAT:
        found = index.get("format") if isinstance(index, dict) else None
        raise bad(f"not an {FORMAT!r} index (format {found!r})")
    version = index.get("version")
    if not isinstance(version, int) or version < 1:
        raise bad(f"version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        raise DataError(
            f"{path}: format version {version} is newer than this runtime reads ({FORMAT_VERSION}); "
            "use a launch bundle made by the same fsdp-planner that prepared the data"
        )
    dtype = index.get("dtype")
    if dtype not in DTYPES:
        raise bad(f"dtype {dtype!r} (use uint16 or uint32)")
    if index.get("byte_order", "little") != "little":
        raise bad(f"byte_order {index.get('byte_order')!r} (shards are little-endian)")
    if sys.byteorder != "little":  # pragma: no cover - no big-endian training hosts
        raise DataError(f"{path}: this host is big-endian; the shards are little-endian")
    for key in ("vocab_size", "eos_token_id"):
        if not isinstance(index.get(key), int) or index[key] < 0:
            raise bad(f"{key} {index.get(key)!r} is not a non-negative integer")
    if index["vocab_size"] > 2 ** (8 * ITEMSIZE[dtype]):
        raise bad(f"vocab_size {index['vocab_size']:,} does not fit {dtype}")
    if index["eos_token_id"] >= index["vocab_size"]:
        raise bad(f"eos_token_id {index['eos_token_id']} is not below vocab_size {index['vocab_size']}")
    index.setdefault("tokenizer", "unknown")
    splits = index.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        raise bad("no 'train' split")
    for name, split in splits.items():
        shards = split.get("shards") if isinstance(split, dict) else None
        if not isinstance(shards, list) or not shards:
            raise bad(f"split {name!r} lists no shards")
        for shard in shards:
            file, tokens = shard.get("file"), shard.get("tokens")
            if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
                raise bad(f"split {name!r}: shard file {file!r} is not a plain file name in the directory")
            if not isinstance(tokens, int) or tokens < 0:
                raise bad(f"shard {file!r}: token count {tokens!r}")
            shard_path = directory / file
            if not shard_path.is_file():
                raise DataError(
                    f"{shard_path}: missing (index.json lists it in split {name!r}); copy the whole "
                    "dataset directory, or prepare it again"
                )
            size, expected = shard_path.stat().st_size, tokens * ITEMSIZE[dtype]
            if size != expected:
                raise DataError(
                    f"{shard_path}: {size:,} bytes, but index.json says {tokens:,} {dtype} tokens = "
                    f"{expected:,} bytes: the shard is truncated or from another preparation (or its "
                    "dtype is not the one stated); copy it again or prepare the dataset again"
                )
    return index
