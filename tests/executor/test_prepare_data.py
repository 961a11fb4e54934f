"""`fsdp-planner prepare-data`: text and JSONL into token shards + index.json, checked byte for byte
with the built-in byte tokenizer (no Hugging Face package needed); refusals; the optional Hugging
Face paths (transformers, and tokenizers alone) with a tokenizer built in the test (each skipped when
its package is not installed; the dev extra installs both)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from contract.token_format import FORMAT, FORMAT_VERSION
from executor.runtime.prepare_data import (
    ByteTokenizer,
    PrepareError,
    is_eval_document,
    load_tokenizer,
    parse_count,
    prepare,
)

runner = CliRunner()
EOS = 256


def u16(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}H", *ids)


def doc(text: str) -> list[int]:
    return [*text.encode("utf-8"), EOS]


def invoke(*args: str):
    return runner.invoke(app, ["prepare-data", *args])


def test_text_file_to_shards_byte_for_byte(tmp_path: Path) -> None:
    text = "Hello, world.\nSecond line.\n\nA new paragraph: é.\n\n\nLast one"
    source = tmp_path / "corpus.txt"
    source.write_text(text, encoding="utf-8")
    out = tmp_path / "ds"
    result = invoke(str(source), "-o", str(out), "--tokenizer", "bytes", "--sample-by", "paragraph",
                    "--eval-fraction", "0", "--shard-tokens", "16")
    assert result.exit_code == 0, result.output
    paragraphs = ["Hello, world.\nSecond line.", "A new paragraph: é.", "Last one"]
    stream = [t for p in paragraphs for t in doc(p)]
    index = json.loads((out / "index.json").read_text())
    assert (index["format"], index["version"], index["dtype"], index["byte_order"]) == (
        FORMAT, FORMAT_VERSION, "uint16", "little")
    assert (index["tokenizer"], index["vocab_size"], index["eos_token_id"]) == ("bytes", 257, 256)
    assert "eval" not in index["splits"]
    train = index["splits"]["train"]
    assert train["documents"] == 3 and train["tokens"] == len(stream) == 57
    # 16-token shards, the last one shorter; documents continue across shard boundaries.
    assert [s["tokens"] for s in train["shards"]] == [16, 16, 16, 9]
    assert [s["file"] for s in train["shards"]] == [f"train-{k:05d}.bin" for k in range(4)]
    joined = b"".join((out / s["file"]).read_bytes() for s in train["shards"])
    assert joined == u16(stream)
    assert sorted(p.name for p in out.iterdir()) == ["index.json"] + [s["file"] for s in train["shards"]]
    # The summary and the exact next command.
    assert "train            3 documents              57 tokens     4 shard(s)" in result.output
    assert f"DATA={out.resolve()} ./launch.sh --steps 1000" in result.output
    assert "vocab_size >= 257" in result.output and "no eval split: --eval-fraction 0" in result.output


def test_jsonl_with_a_held_out_split(tmp_path: Path) -> None:
    texts = [f"document number {i}" for i in range(10)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)) + "\n")
    out = tmp_path / "ds"
    result = invoke(str(source), "-o", str(out), "--tokenizer", "bytes", "--text-field", "body",
                    "--eval-fraction", "0.2", "--seed", "3")
    assert result.exit_code == 0, result.output
    index = json.loads((out / "index.json").read_text())
    splits = index["splits"]
    phase = __import__("random").Random(3).random()
    held = [i for i in range(10) if is_eval_document(i, fraction=0.2, phase=phase)]
    assert len(held) == 2  # every 5th document, from a seeded start
    for name, numbers in (("eval", held), ("train", [i for i in range(10) if i not in held])):
        expected = [t for i in numbers for t in doc(texts[i])]
        assert splits[name]["documents"] == len(numbers) and splits[name]["tokens"] == len(expected)
        assert (out / f"{name}-00000.bin").read_bytes() == u16(expected)
    assert "eval             2 documents" in result.output and "--eval-every 100" in result.output
    # The same seed gives the same split; another seed may hold out other documents, never a share
    # other than 2 of 10.
    again = tmp_path / "again"
    assert invoke(str(source), "-o", str(again), "--tokenizer", "bytes", "--text-field", "body",
                  "--eval-fraction", "0.2", "--seed", "3").exit_code == 0
    assert (again / "eval-00000.bin").read_bytes() == (out / "eval-00000.bin").read_bytes()
    for seed in range(5):
        phase = __import__("random").Random(seed).random()
        assert sum(is_eval_document(i, fraction=0.2, phase=phase) for i in range(10)) == 2


def test_long_documents_are_read_in_slices_and_gzip_and_directories(tmp_path: Path, monkeypatch) -> None:
    import gzip

    import executor.runtime.prepare_data as prep

    monkeypatch.setattr(prep, "TEXT_PER_BATCH", 64)  # slice a document every ~64 characters
    lines = [f"line {i} of a long document\n" for i in range(40)]
    folder = tmp_path / "in"
    folder.mkdir()
    with gzip.open(folder / "b.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(lines))
    (folder / "a.md").write_text("short\n")
    (folder / "ignored.bin").write_bytes(b"\x00\x01")
    out = tmp_path / "ds"
    summary = prepare([folder], out, tokenizer=ByteTokenizer(), eval_fraction=0)
    expected = doc("short\n") + doc("".join(lines))  # a.md first (sorted), one EOS per document
    assert (out / "train-00000.bin").read_bytes() == u16(expected)
    assert summary.index["splits"]["train"]["documents"] == 2
    assert summary.index["sources"] == [str(folder / "a.md"), str(folder / "b.txt.gz")]


def test_refusals(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = tmp_path / "ds"
    result = invoke(str(empty), "-o", str(out), "--tokenizer", "bytes")
    assert result.exit_code == 2 and "the input holds no text" in result.output
    assert not out.exists()  # nothing half-made is left behind
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": ""}\n\n')
    assert "no text" in invoke(str(blank), "-o", str(out), "--tokenizer", "bytes").output

    source = tmp_path / "a.txt"
    source.write_text("some text\n")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    result = invoke(str(source), "-o", str(occupied), "--tokenizer", "bytes")
    assert result.exit_code == 2 and "not empty" in result.output and "--overwrite" in result.output
    result = invoke(str(source), "-o", str(occupied), "--tokenizer", "bytes", "--overwrite")
    assert result.exit_code == 2 and "notes.txt" in result.output  # --overwrite replaces datasets only
    assert (occupied / "notes.txt").read_text() == "mine"
    # A previous dataset is replaced with --overwrite, and only then.
    assert invoke(str(source), "-o", str(out), "--tokenizer", "bytes", "--eval-fraction", "0").exit_code == 0
    assert invoke(str(source), "-o", str(out), "--tokenizer", "bytes").exit_code == 2
    assert invoke(str(source), "-o", str(out), "--tokenizer", "bytes", "--overwrite",
                  "--eval-fraction", "0").exit_code == 0

    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "fine"}\n{"txt": "wrong field"}\n')
    result = invoke(str(bad_json), "-o", str(tmp_path / "x"), "--tokenizer", "bytes")
    assert result.exit_code == 2
    assert f"{bad_json}:2: no 'text' field (it has: txt)" in " ".join(result.output.split())
    assert not (tmp_path / "x").exists()

    result = invoke(str(source), "-o", str(tmp_path / "y"), "--tokenizer", "bytes", "--dtype", "uint8")
    assert result.exit_code == 2 and "--dtype" in result.output
    result = invoke(str(tmp_path / "missing.txt"), "-o", str(tmp_path / "y"), "--tokenizer", "bytes")
    assert result.exit_code == 2 and "no such file" in result.output

    class Huge(ByteTokenizer):
        name = "huge"
        vocab_size = 70_000

    with pytest.raises(PrepareError, match="more than uint16 holds"):
        prepare([source], tmp_path / "z", tokenizer=Huge(), dtype="uint16")
    # auto picks uint32 for it, and then a 4-byte shard.
    summary = prepare([source], tmp_path / "z", tokenizer=Huge(), eval_fraction=0)
    assert summary.index["dtype"] == "uint32"
    assert (tmp_path / "z" / "train-00000.bin").read_bytes() == struct.pack("<11I", *doc("some text\n"))
    assert parse_count("100M") == 100_000_000 and parse_count("64k") == 64_000 and parse_count("7") == 7
    with pytest.raises(PrepareError):
        parse_count("lots")


def hide_packages(monkeypatch, *names: str) -> None:
    """Imports of `names` fail in this test, as on a machine without those packages."""
    import builtins

    real_import = builtins.__import__

    def hidden(name, *args, **kwargs):
        if name.split(".")[0] in names:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", hidden)


def test_hugging_face_tokenizer_without_the_package_says_what_to_install(monkeypatch) -> None:
    hide_packages(monkeypatch, "transformers", "tokenizers")
    with pytest.raises(PrepareError, match="pip install tokenizers") as info:
        load_tokenizer("gpt2")
    assert "--tokenizer bytes" in str(info.value)


@pytest.mark.parametrize("library", ["transformers", "tokenizers"])
def test_a_tokenizers_tokenizer_built_here(tmp_path: Path, monkeypatch, library: str) -> None:
    # A bare tokenizer.json (no tokenizer_config.json naming the eos): through transformers where it is
    # installed, else through tokenizers (transformers hidden); both give the same shards.
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip(library)
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "hello": 2, "world": 3, "again": 4}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    source = tmp_path / "a.jsonl"
    source.write_text('{"text": "hello world"}\n{"text": "world again hello"}\n')
    out = tmp_path / "ds"
    if library == "tokenizers":
        hide_packages(monkeypatch, "transformers")
    loaded = load_tokenizer(str(path.parent))
    assert loaded.library == library
    summary = prepare([source], out, tokenizer=loaded, eval_fraction=0)
    assert (summary.index["vocab_size"], summary.index["eos_token_id"]) == (5, 1)
    assert (out / "train-00000.bin").read_bytes() == u16([2, 3, 1, 3, 4, 2, 1])


REPO = Path(__file__).resolve().parents[2]


def test_the_docs_prepare_data_example_runs_on_the_shipped_sample(tmp_path: Path, monkeypatch) -> None:
    # The data page's example names a corpus the repository ships, and prints what running it prints.
    readme = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    command = next(line.strip()[2:] for line in readme.splitlines()
                   if line.strip().startswith("$ fsdp-planner prepare-data "))
    argv = command.split()[2:]
    assert argv[0] == "examples/docs.jsonl" and (REPO / argv[0]).is_file()
    assert (REPO / argv[0]).stat().st_size < 200_000  # a sample, not a dataset
    monkeypatch.chdir(REPO)  # relative to the checkout, as a person runs it
    out = tmp_path / "pydocs"
    argv[argv.index("-o") + 1] = str(out)
    result = invoke(*argv)
    assert result.exit_code == 0, result.output
    for split in ("train", "eval", "total"):  # documents and tokens, as the page shows them
        printed = next(" ".join(line.split()[:5]) for line in result.output.splitlines()
                       if line.split()[:1] == [split])
        assert any(" ".join(line.split()[:5]) == printed for line in readme.splitlines()), printed
    index = json.loads((out / "index.json").read_text())
    assert index["sources"] == ["examples/docs.jsonl"]
    assert '"sources": ["examples/docs.jsonl"]' in readme


def test_a_python_file_and_a_folder_of_them_are_read_alike(tmp_path: Path) -> None:
    """One rule for a file named and files found in a folder: by suffix under --format auto (both
    refused for .py, saying how to read them), every file as text under --format text (both taken)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text("print('hello')\n")
    for given in (folder, folder / "train.py"):
        refused = invoke(str(given), "-o", str(tmp_path / "refused"), "--tokenizer", "bytes")
        text = " ".join(refused.output.split())
        assert refused.exit_code == 2 and "--format text" in text, text
        assert not (tmp_path / "refused").exists()
        out = tmp_path / f"taken-{given.name}"
        taken = invoke(str(given), "-o", str(out), "--tokenizer", "bytes", "--format", "text",
                       "--eval-fraction", "0")
        assert taken.exit_code == 0, taken.output
        assert (out / "train-00000.bin").read_bytes() == u16(doc("print('hello')\n"))
