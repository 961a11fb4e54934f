"""Tokenise text or JSONL into the trainer's dataset format (`fsdp-planner prepare-data`).

The format (`fsdp-planner-tokens` version 1) is declared in `contract/token_format.py`, read
by `executor/runtime/data.py` and documented in docs/data.md: a directory of raw
little-endian uint16/uint32 token shards (`train-00000.bin`, ..., `eval-00000.bin`) and an
`index.json` written last. Every document's tokens are followed by the tokenizer's end-of-text id
(the document separator).

This module needs only the standard library: the shards are written with `array` while the input
is read, a batch of documents at a time, so the corpus is never in memory. Tokenizers:

- `bytes`: built in, the UTF-8 bytes of the text (ids 0-255), end of document 256: vocabulary 257;
- a Hugging Face tokenizer name (`gpt2`, `meta-llama/Llama-3.1-8B`) or a local directory or
  `tokenizer.json`: through `transformers` (AutoTokenizer) when it is installed, else `tokenizers`.

The held-out eval split takes whole documents: every 1/eval_fraction-th one, counted from a
starting point drawn from the split seed, so the split is exact, spread over the whole input and
reproducible.
"""

from __future__ import annotations

import array
import contextlib
import gzip
import io
import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from contract.token_format import DTYPE_LIMITS, FORMAT, FORMAT_VERSION, INDEX, SHARD_NAME

TEXT_SUFFIXES = {".txt", ".text", ".md"}
JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|end|>")
"""End-of-text tokens tried, in order, when a tokenizer does not say which it uses."""
DOCS_PER_BATCH = 256
TEXT_PER_BATCH = 4 << 20
"""Characters of text tokenised in one call (a batch of documents, or a slice of a long one)."""
FLUSH_TOKENS = 1 << 20


class PrepareError(ValueError):
    """Input or options that prepare-data cannot use; the message says what to do."""


class Tokenizer(Protocol):
    name: str
    library: str
    vocab_size: int
    eos_token_id: int

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (0-255) and 256 as end of document: needs nothing installed."""

    name = "bytes"
    library = "builtin"
    vocab_size = 257
    eos_token_id = 256

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]


class _TransformersTokenizer:
    library = "transformers"

    def __init__(self, name: str, tok: Any, eos_token: str | None) -> None:
        self.name, self.tok = name, tok
        # Documents are longer than the model's context; the trainer cuts them, not the tokenizer.
        tok.model_max_length = sys.maxsize
        self.vocab_size = len(tok)
        if eos_token is not None:
            eos = tok.convert_tokens_to_ids(eos_token)
            if eos is None or eos == tok.unk_token_id:
                raise PrepareError(f"--eos-token {eos_token!r} is not a token of {name!r}")
        else:
            eos = tok.eos_token_id
            if eos is None:
                # A bare tokenizer.json (no tokenizer_config.json) names no eos to transformers; the
                # same directory loads through `tokenizers` by these candidates, so it must here too.
                known = (tok.convert_tokens_to_ids(c) for c in EOS_CANDIDATES)
                eos = next((i for i in known if i is not None and i != tok.unk_token_id), None)
            if eos is None:
                raise PrepareError(
                    f"tokenizer {name!r} names no end-of-text token and has none of "
                    f"{', '.join(EOS_CANDIDATES)}; pass --eos-token (e.g. '</s>')"
                )
        self.eos_token_id = int(eos)

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        return [list(ids) for ids in self.tok(texts, add_special_tokens=add_special_tokens)["input_ids"]]


class _TokenizersTokenizer:
    library = "tokenizers"

    def __init__(self, name: str, tok: Any, eos_token: str | None) -> None:
        self.name, self.tok = name, tok
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        candidates = (eos_token,) if eos_token is not None else EOS_CANDIDATES
        for candidate in candidates:
            eos = tok.token_to_id(candidate)
            if eos is not None:
                self.eos_token_id = int(eos)
                break
        else:
            if eos_token is not None:
                raise PrepareError(f"--eos-token {eos_token!r} is not a token of {name!r}")
            raise PrepareError(
                f"tokenizer {name!r}: none of {', '.join(EOS_CANDIDATES)} is a token of it; name its "
                "end-of-text token with --eos-token"
            )

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=add_special_tokens)]


def load_tokenizer(spec: str, *, eos_token: str | None = None) -> Tokenizer:
    """`bytes`, or a Hugging Face tokenizer (name, directory or tokenizer.json): through
    `transformers` when installed, else (or when transformers cannot load it) `tokenizers`."""
    if spec == "bytes":
        if eos_token is not None:
            raise PrepareError("--eos-token does not apply to --tokenizer bytes (its end of document is 256)")
        return ByteTokenizer()
    failures = []
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        path = Path(spec)
        source = str(path.parent) if path.is_file() else spec  # AutoTokenizer takes the directory
        try:
            tok = AutoTokenizer.from_pretrained(source)
        except Exception as exc:
            failures.append(f"transformers: {_first_line(exc)}")
        else:
            return _TransformersTokenizer(spec, tok, eos_token)
    try:
        from tokenizers import Tokenizer as HFTokenizer  # type: ignore[import-not-found]
    except ImportError:
        if failures:
            raise PrepareError(f"--tokenizer {spec!r}: cannot load it ({failures[0]})") from None
        raise PrepareError(
            f"--tokenizer {spec!r} needs the Hugging Face `tokenizers` (or `transformers`) package on this "
            "machine: `pip install tokenizers`; or use `--tokenizer bytes` (built in: UTF-8 bytes, "
            "vocabulary 257) to try the pipeline without it"
        ) from None
    path = Path(spec)
    try:
        if path.is_dir() and (path / "tokenizer.json").is_file():
            tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        elif path.is_file():
            tok = HFTokenizer.from_file(str(path))
        elif path.exists():
            failures.append("tokenizers: no tokenizer.json in that directory (install `transformers` for "
                            "other formats)")
            tok = None
        else:
            tok = HFTokenizer.from_pretrained(spec)
    except Exception as exc:
        failures.append(f"tokenizers: {_first_line(exc)}")
        tok = None
    if tok is None:
        raise PrepareError(f"--tokenizer {spec!r}: cannot load it ({'; '.join(failures)})")
    return _TokenizersTokenizer(spec, tok, eos_token)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def parse_count(text: str) -> int:
    """`100M`, `64k`, `1G`, `5000000` -> an integer (K/M/G are powers of 1000)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not match:
        raise PrepareError(f"{text!r} is not a count (e.g. 100M, 64k, 5000000)")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2).lower()]
    return int(value)


# -- input -------------------------------------------------------------------------------------


def input_files(paths: list[Path], *, fmt: str = "auto") -> list[Path]:
    """The files to read: files as given, directories expanded to their files (sorted).

    One rule for both: with `fmt` auto, a file is read when its suffix says text or JSONL
    (.txt/.md/.jsonl/.json, optionally .gz), whether named or found in a directory, and a named file
    of another suffix (`train.py`) is refused, as a directory of only such files is; with `fmt` text
    or jsonl every file is read as that format."""
    known = TEXT_SUFFIXES | JSONL_SUFFIXES
    hint = "pass --format text (or jsonl) to read every file as that format"
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and (fmt != "auto" or _kind_suffix(p) in known)
            )
            if not found and fmt != "auto":
                raise PrepareError(f"{path}: no files in this directory")
            if not found:
                raise PrepareError(
                    f"{path}: no .txt/.md/.jsonl/.json files (optionally .gz) in this directory; {hint}"
                )
            files += found
        elif path.is_file():
            if fmt == "auto" and _kind_suffix(path) not in known:
                raise PrepareError(
                    f"{path}: not a .txt/.md/.jsonl/.json file (optionally .gz), so its format is unknown; "
                    + hint
                )
            files.append(path)
        else:
            raise PrepareError(f"{path}: no such file or directory")
    return files


def _kind_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _open_text(path: Path) -> IO[str]:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def file_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    return "jsonl" if _kind_suffix(path) in JSONL_SUFFIXES else "text"


def read_documents(
    path: Path, *, fmt: str, text_field: str, sample_by: str
) -> Iterator[Iterator[str]]:
    """Documents of one file, each as its text in pieces (one piece, except for a long document
    read with `sample_by=document`, which comes in slices ending at line breaks)."""
    with _open_text(path) as handle:
        if file_format(path, fmt) == "jsonl":
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise PrepareError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
                if not isinstance(record, dict) or text_field not in record:
                    keys = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
                    raise PrepareError(
                        f"{path}:{number}: no {text_field!r} field (it has: {keys}); name the text's field "
                        "with --text-field"
                    )
                text = record[text_field]
                if not isinstance(text, str):
                    raise PrepareError(
                        f"{path}:{number}: field {text_field!r} is a {type(text).__name__}, not text"
                    )
                if text:
                    yield iter((text,))
        elif sample_by == "line":
            for line in handle:
                text = line.rstrip("\r\n")
                if text.strip():
                    yield iter((text,))
        elif sample_by == "paragraph":
            lines: list[str] = []
            for line in handle:
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield iter(("".join(lines).rstrip("\r\n"),))
                    lines = []
            if lines:
                yield iter(("".join(lines).rstrip("\r\n"),))
        else:  # the whole file is one document, read in slices
            first = handle.read(1)
            if first:
                yield _slices(first, handle)


def _slices(first: str, handle: IO[str]) -> Iterator[str]:
    buffer = [first]
    size = 1
    for line in handle:
        buffer.append(line)
        size += len(line)
        if size >= TEXT_PER_BATCH:
            yield "".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield "".join(buffer)


# -- output ------------------------------------------------------------------------------------


def _array_code(dtype: str) -> str:
    if dtype == "uint16":
        return "H"
    return next(code for code in ("I", "L") if array.array(code).itemsize == 4)


@dataclass
class SplitWriter:
    """Appends token ids to `<name>-NNNNN.bin` shards of at most `shard_tokens` tokens."""

    directory: Path
    name: str
    dtype: str
    shard_tokens: int
    shards: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    tokens: int = 0
    _buffer: array.array = field(init=False)
    _file: IO[bytes] | None = None

    def __post_init__(self) -> None:
        self._buffer = array.array(_array_code(self.dtype))

    def add(self, ids: list[int]) -> None:
        self._buffer.extend(ids)
        self.tokens += len(ids)
        if len(self._buffer) >= FLUSH_TOKENS:
            self.flush()

    def flush(self) -> None:
        buffer = self._buffer
        start = 0
        while start < len(buffer):
            if self._file is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._next_shard()
            shard = self.shards[-1]
            take = min(len(buffer) - start, self.shard_tokens - shard["tokens"])
            piece = buffer[start : start + take]
            if sys.byteorder != "little":  # pragma: no cover - the format is little-endian
                piece.byteswap()
            assert self._file is not None
            self._file.write(piece.tobytes())
            shard["tokens"] += take
            start += take
        del buffer[:]

    def _next_shard(self) -> None:
        if self._file is not None:
            self._file.close()
        name = f"{self.name}-{len(self.shards):05d}.bin"
        self._file = (self.directory / name).open("wb")
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> dict[str, Any]:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
        return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}


@dataclass(frozen=True)
class Summary:
    directory: Path
    index: dict[str, Any]
    elapsed_s: float
    bytes_written: int


def prepare_output(directory: Path, *, overwrite: bool) -> None:
    """Create `directory`, or empty a previous dataset there when `overwrite`; refuse anything else."""
    if directory.exists() and not directory.is_dir():
        raise PrepareError(f"--out {directory}: exists and is not a directory")
    if directory.is_dir():
        entries = sorted(directory.iterdir())
        if entries and not overwrite:
            raise PrepareError(
                f"--out {directory}: not empty ({len(entries)} entries); pass --overwrite to replace the "
                "dataset there, or choose a new directory"
            )
        ours = [p for p in entries if p.is_file() and (p.name == INDEX or SHARD_NAME.match(p.name))]
        others = [p.name for p in entries if p not in ours]
        if others:
            raise PrepareError(
                f"--out {directory}: --overwrite replaces a prepared dataset only, and this directory "
                f"also holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}; choose another"
            )
        # The index first: a half-deleted directory must not look like a finished dataset.
        for path in sorted(ours, key=lambda p: p.name != INDEX):
            path.unlink()
    directory.mkdir(parents=True, exist_ok=True)


def is_eval_document(number: int, *, fraction: float, phase: float) -> bool:
    """Document `number` (0-based) goes to the eval split: every 1/fraction-th document from a
    starting point set by `phase` in [0, 1). Over n documents, floor(n x fraction + phase) do."""
    if fraction <= 0:
        return False
    return int((number + 1) * fraction + phase) > int(number * fraction + phase)


def prepare(
    inputs: list[Path],
    out: Path,
    *,
    tokenizer: Tokenizer,
    fmt: str = "auto",
    text_field: str = "text",
    sample_by: str = "document",
    dtype: str = "auto",
    shard_tokens: int = 100_000_000,
    eval_fraction: float = 0.01,
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Summary:
    """Tokenise `inputs` into a dataset directory `out` (see the module docstring): check the
    options, write the splits' shards, check what they hold, then write the index that makes them a
    dataset."""
    dtype = _checked_options(
        tokenizer, fmt=fmt, sample_by=sample_by, dtype=dtype, shard_tokens=shard_tokens,
        eval_fraction=eval_fraction,
    )
    files = input_files(inputs, fmt=fmt)
    if not files:
        raise PrepareError("no input files: name text or JSONL files (or directories of them)")
    created = not out.exists()
    prepare_output(out, overwrite=overwrite)
    started = time.perf_counter()
    writers = {name: SplitWriter(out, name, dtype, shard_tokens) for name in ("train", "eval")}
    phase = random.Random(seed).random()
    tokens = _DocumentTokens(tokenizer, writers, eval_fraction=eval_fraction, phase=phase)
    try:
        documents = _write_documents(
            files, tokens, fmt=fmt, text_field=text_field, sample_by=sample_by, progress=progress
        )
        splits = {name: writer.close() for name, writer in writers.items()}
    except BaseException:
        # No index.json was written, so the shards are unusable: leave nothing half-made behind.
        for writer in writers.values():
            with contextlib.suppress(Exception):
                writer.close()
        _remove_dataset(out, created=created)
        raise
    try:
        _check_splits(splits, files=files, documents=documents, fmt=fmt, text_field=text_field)
    except PrepareError:
        _remove_dataset(out, created=created)
        raise
    if not splits["eval"]["shards"]:
        del splits["eval"]
    index = _index_document(
        tokenizer, splits, dtype=dtype, max_id=tokens.max_id, eval_fraction=eval_fraction, seed=seed,
        sample_by=sample_by, text_field=text_field, files=files,
    )
    # index.json last, atomically: its presence means the shards are complete.
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / INDEX)
    total_tokens = sum(split["tokens"] for split in splits.values())
    return Summary(
        directory=out,
        index=index,
        elapsed_s=time.perf_counter() - started,
        bytes_written=total_tokens * (2 if dtype == "uint16" else 4),
    )


def _index_document(
    tokenizer: Tokenizer,
    splits: dict[str, dict[str, Any]],
    *,
    dtype: str,
    max_id: int,
    eval_fraction: float,
    seed: int,
    sample_by: str,
    text_field: str,
    files: list[Path],
) -> dict[str, Any]:
    """The dataset's index.json (contract/token_format.py): its format, tokenizer, splits and sources."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "dtype": dtype,
        "byte_order": "little",
        "tokenizer": tokenizer.name,
        "tokenizer_library": tokenizer.library,
        "vocab_size": tokenizer.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "document_separator": "eos_token_id after every document",
        "max_token_id": max_id,
        "splits": splits,
        "eval_fraction": eval_fraction,
        "split_seed": seed,
        "sample_by": sample_by,
        "text_field": text_field,
        "sources": [str(p) for p in files],
        "created_by": "fsdp-planner prepare-data",
    }


def _checked_options(
    tokenizer: Tokenizer, *, fmt: str, sample_by: str, dtype: str, shard_tokens: int, eval_fraction: float
) -> str:
    """Refuse options that cannot work, naming the flag and the fix; the token dtype to write."""
    if not 0 <= eval_fraction < 1:
        raise PrepareError(f"--eval-fraction {eval_fraction}: use a fraction in [0, 1), e.g. 0.01")
    if shard_tokens < 1:
        raise PrepareError("--shard-tokens must be at least 1")
    if fmt not in ("auto", "text", "jsonl"):
        raise PrepareError(f"--format {fmt!r}: use auto, text or jsonl")
    if sample_by not in ("document", "paragraph", "line"):
        raise PrepareError(f"--sample-by {sample_by!r}: use document, paragraph or line")
    vocab = tokenizer.vocab_size
    if dtype == "auto":
        dtype = "uint16" if vocab <= DTYPE_LIMITS["uint16"] else "uint32"
    if dtype not in DTYPE_LIMITS:
        raise PrepareError(f"--dtype {dtype!r}: use auto, uint16 or uint32")
    if vocab > DTYPE_LIMITS[dtype]:
        raise PrepareError(
            f"tokenizer {tokenizer.name!r} has {vocab:,} tokens, more than {dtype} holds "
            f"({DTYPE_LIMITS[dtype]:,}); use --dtype uint32 (or leave --dtype auto)"
        )
    return dtype


class _DocumentTokens:
    """Tokenises batches of document pieces and writes each document to its split: the eval split
    takes every document `is_eval_document` picks, and every document ends with the EOS token."""

    def __init__(
        self, tokenizer: Tokenizer, writers: dict[str, SplitWriter], *, eval_fraction: float, phase: float
    ) -> None:
        self.tokenizer = tokenizer
        self.writers = writers
        self.eval_fraction = eval_fraction
        self.phase = phase
        self.max_id = -1
        self._document = -1  # the document being written (a long one spans batches) ...
        self._document_tokens = 0  # ... and its tokens so far

    def write(self, pending: list[tuple[int, str, bool, bool]]) -> None:
        """Tokenise (document number, text, first piece, last piece) and write each to its split."""
        eos, vocab = self.tokenizer.eos_token_id, self.tokenizer.vocab_size
        for (number, _, _, last), ids in zip(pending, self._encoded(pending), strict=True):
            if number != self._document:
                self._document, self._document_tokens = number, 0
            if last and (ids or self._document_tokens) and (not ids or ids[-1] != eos):
                ids.append(eos)
            if not ids:
                continue
            top, bottom = max(ids), min(ids)
            if top >= vocab or bottom < 0:
                raise PrepareError(
                    f"tokenizer {self.tokenizer.name!r} returned id {top if top >= vocab else bottom}, "
                    f"outside its stated vocabulary of {vocab:,}"
                )
            self.max_id = max(self.max_id, top)
            evaluated = is_eval_document(number, fraction=self.eval_fraction, phase=self.phase)
            writer = self.writers["eval" if evaluated else "train"]
            writer.add(ids)
            self._document_tokens += len(ids)
            if last:
                writer.documents += 1

    def _encoded(self, pending: list[tuple[int, str, bool, bool]]) -> list[list[int]]:
        # A document's first piece gets the tokenizer's special tokens (e.g. BOS), later slices not.
        encoded: list[list[int]] = [[] for _ in pending]
        for special in (True, False):
            where = [k for k, item in enumerate(pending) if item[2] is special]
            if where:
                texts = [pending[k][1] for k in where]
                batch = self.tokenizer.encode_batch(texts, add_special_tokens=special)
                for k, ids in zip(where, batch, strict=True):
                    encoded[k] = list(ids)
        return encoded

    @property
    def written(self) -> int:
        return sum(writer.tokens for writer in self.writers.values())


def _write_documents(
    files: list[Path],
    tokens: _DocumentTokens,
    *,
    fmt: str,
    text_field: str,
    sample_by: str,
    progress: Callable[[int, int], None] | None,
) -> int:
    """Read every document of `files` and write its tokens, in batches; the number of documents."""
    documents = 0
    pending: list[tuple[int, str, bool, bool]] = []
    chars = 0
    last_report = time.perf_counter()
    for path in files:
        for document in read_documents(path, fmt=fmt, text_field=text_field, sample_by=sample_by):
            for first, last, piece in _ends(document):
                pending.append((documents, piece, first, last))
                chars += len(piece)
                if len(pending) >= DOCS_PER_BATCH or chars >= TEXT_PER_BATCH:
                    tokens.write(pending)
                    pending, chars = [], 0
                    if progress is not None and time.perf_counter() - last_report > 10:
                        progress(documents, tokens.written)
                        last_report = time.perf_counter()
            documents += 1
    if pending:
        tokens.write(pending)
    return documents


def _check_splits(
    splits: dict[str, dict[str, Any]], *, files: list[Path], documents: int, fmt: str, text_field: str
) -> None:
    """Refuse a dataset with no text, or with no training text."""
    if splits["train"]["tokens"] + splits["eval"]["tokens"] == 0:
        raise PrepareError(
            f"the input holds no text ({len(files)} file(s)"
            + (f"; JSONL records need a non-empty {text_field!r} field" if fmt != "text" else "")
            + ")"
        )
    if splits["train"]["tokens"] == 0:
        raise PrepareError(
            f"every document ({documents}) went to the eval split; lower --eval-fraction or add documents"
        )


def _ends(pieces: Iterator[str]) -> Iterator[tuple[bool, bool, str]]:
    """(first, last, piece) for each piece."""
    previous: str | None = None
    first = True
    for piece in pieces:
        if previous is not None:
            yield first, False, previous
            first = False
        previous = piece
    if previous is not None:
        yield first, True, previous


def _remove_dataset(directory: Path, *, created: bool) -> None:
    for path in directory.iterdir():
        if path.name == INDEX or SHARD_NAME.match(path.name):
            path.unlink()
    if created:
        with contextlib.suppress(OSError):
            directory.rmdir()
