"""`fsdp-planner prepare-data`: tokenise text or JSONL files into the trainer's dataset format.

The work is in `executor.runtime.prepare_data` (standard library only; a Hugging Face tokenizer is imported
only when one is named): no torch here, on the client or the server. It is imported when the command
runs, as `trace` imports the profiler: `fsdp-planner serve` is this CLI's process, and the web process
never imports the runtime.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import WholeNumber, decimal_number, fail, whole_number
from planner.bounds import MAX_SHARD_TOKENS


@dataclass(frozen=True, kw_only=True)
class TokenCount(WholeNumber):
    """The parser of a token count typed with a decimal suffix (`100M`, `64k`, `5000000`: the runtime's
    `parse_count`, which `python -m executor.runtime.prepare_data` reads too), in [low, high] tokens."""

    default: int

    def describe(self) -> str:
        return f"Range: {self.low:,} to {self.high:,} {self.unit}; 100M = 100,000,000."

    def __call__(self, raw: str | int) -> int:
        if isinstance(raw, int):  # a default
            return raw
        assert self.high is not None
        # The runtime's reader (standard library only), imported when the option is read.
        from executor.runtime.prepare_data import PrepareError, parse_count

        bounds = self.describe().removeprefix("Range: ")
        try:
            value = parse_count(raw)
        except PrepareError as exc:
            raise typer.BadParameter(f"{exc}; give {bounds}") from None
        if not self.low <= value <= self.high:
            raise typer.BadParameter(f"{raw.strip()} is out of range: give {bounds}")
        return value


SHARD_TOKENS = TokenCount(unit="tokens", low=1, high=MAX_SHARD_TOKENS, default=100_000_000)
"""`--shard-tokens`: tokens per shard file."""


def _progress(documents: int, tokens: int) -> None:
    typer.echo(f"  ... {documents:,} documents, {tokens:,} tokens", err=True)


def register(app: typer.Typer) -> None:
    app.command("prepare-data")(prepare_data)


def prepare_data(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            metavar="INPUT...",
            help="Text files (.txt, .md), JSONL files (.jsonl, .json), optionally .gz, or directories "
            "of them.",
        ),
    ],
    out: Annotated[Path, typer.Option("-o", "--out", help="Dataset directory to write.")],
    tokenizer: Annotated[
        str,
        typer.Option(
            help="A Hugging Face tokenizer name or local path (needs `transformers` or `tokenizers`), or "
            "`bytes` (built in: UTF-8 bytes + end of document, vocabulary 257)."
        ),
    ],
    text_field: Annotated[
        str, typer.Option("--text-field", help="JSONL: the field holding the text.")
    ] = "text",
    fmt: Annotated[
        str, typer.Option("--format", help="auto (by suffix: .jsonl/.json are JSONL) | text | jsonl")
    ] = "auto",
    sample_by: Annotated[
        str,
        typer.Option(
            "--sample-by",
            help="Text files: what one document is: document (the whole file) | paragraph (blank-line "
            "separated) | line. JSONL: one record.",
        ),
    ] = "document",
    eval_fraction: Annotated[
        float,
        typer.Option(
            "--eval-fraction", parser=decimal_number(unit="(a share of the documents)", high=1.0),
            help="Share of the documents held out as the eval split (0: none).",
        ),
    ] = 0.01,
    seed: Annotated[int, typer.Option(
        parser=whole_number(unit="(any whole number)"), help="Seed choosing which documents are held out.",
    )] = 0,
    shard_tokens: Annotated[int, typer.Option(
        "--shard-tokens", parser=SHARD_TOKENS, metavar="COUNT",
        help="Tokens per shard file (e.g. 100M, 50000; k, M, G are powers of 1000).",
    )] = SHARD_TOKENS.default,
    dtype: Annotated[
        str, typer.Option(help="auto (uint16 up to 65,536 tokens, else uint32) | uint16 | uint32")
    ] = "auto",
    eos_token: Annotated[
        str | None,
        typer.Option(
            "--eos-token", help="The document separator token (default: the tokenizer's end of text)."
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a dataset already in --out.")
    ] = False,
) -> None:
    """Tokenise text or JSONL into memory-mapped token shards + index.json for `launch.sh --data`."""
    from executor.runtime.prepare_data import PrepareError, load_tokenizer, prepare

    try:
        tok = load_tokenizer(tokenizer, eos_token=eos_token)
        summary = prepare(
            inputs,
            out,
            tokenizer=tok,
            fmt=fmt,
            text_field=text_field,
            sample_by=sample_by,
            dtype=dtype,
            shard_tokens=shard_tokens,
            eval_fraction=eval_fraction,
            seed=seed,
            overwrite=overwrite,
            progress=_progress,
        )
    except PrepareError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: {exc.strerror or exc}") from None
    index = summary.index
    splits = index["splits"]
    directory = summary.directory.resolve()
    typer.echo(
        f"wrote {directory}: tokenizer {index['tokenizer']} ({index['tokenizer_library']}), vocabulary "
        f"{index['vocab_size']:,}, end of document {index['eos_token_id']}, {index['dtype']}"
    )
    for name in ("train", "eval"):
        split = splits.get(name)
        if split is None:
            continue
        typer.echo(
            f"  {name:<5} {split['documents']:>12,} documents {split['tokens']:>15,} tokens "
            f"{len(split['shards']):>5} shard(s)"
        )
    documents = sum(s["documents"] for s in splits.values())
    tokens = sum(s["tokens"] for s in splits.values())
    typer.echo(
        f"  total {documents:>12,} documents {tokens:>15,} tokens   {summary.bytes_written / 1e6:,.1f} MB "
        f"in {summary.elapsed_s:.1f} s"
    )
    if "eval" not in splits:
        hint = ""
        if sample_by == "document":
            hint = "; --sample-by paragraph or line makes more, smaller documents"
        reason = (
            "--eval-fraction 0"
            if eval_fraction == 0
            else f"no document fell in it ({documents:,} documents x --eval-fraction {eval_fraction:g} "
            f"< 1{hint})"
        )
        typer.echo(f"  no eval split: {reason}; --eval-every needs one")
    data = shlex.quote(str(directory))
    eval_flag = " --eval-every 100" if "eval" in splits else ""
    typer.echo(
        f"next (the plan's model needs vocab_size >= {index['vocab_size']:,}), from a launch bundle "
        "(`fsdp-planner launcher`):"
    )
    typer.echo(f"  DATA={data} ./launch.sh --steps 1000{eval_flag}")
    typer.echo(f"  or: python -m executor.runtime.train --plan plan.json --data {data}{eval_flag}")
