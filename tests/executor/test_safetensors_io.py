"""The runtime's own safetensors reader and writer (executor/runtime/safetensors_io.py).

Byte-level checks of the format (header length, JSON header, offsets, padding), every dtype, the
sharded index, and the errors a person gets for a truncated or corrupt file; cross-checked against
the `safetensors` package both ways when it is installed (it is not a dependency).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from executor.runtime.safetensors_io import (
    DTYPES,
    INDEX_FILE,
    SafetensorsCheckpoint,
    SafetensorsError,
    SafetensorsFile,
    WeightsError,
    plan_shards,
    read_header,
    shard_file_names,
    write_safetensors,
)
from tests.executor.hf_checkpoint import LLAMA_CONFIG, random_weights, write_checkpoint


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "f16": torch.randn(7, generator=g).to(torch.float16),
        "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.arange(-3, 3, dtype=torch.int64),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }


def test_write_then_read_every_dtype(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "t.safetensors"
    size = write_safetensors(path, tensors, metadata={"format": "pt"})
    assert path.stat().st_size == size
    with SafetensorsFile(path) as f:
        assert f.metadata == {"format": "pt"}
        assert set(f.keys()) == set(tensors)
        for name, t in tensors.items():
            got = f.tensor(name)
            assert got.dtype == t.dtype and got.shape == t.shape, name
            assert torch.equal(got, t), name
            # Every tensor starts aligned to its element size (larger dtypes are written first).
            assert f.info(name).begin % t.element_size() == 0, name


def test_header_layout_is_the_format(tmp_path: Path) -> None:
    """8-byte little-endian length, a JSON header padded to 8 bytes, then the raw bytes."""
    path = tmp_path / "t.safetensors"
    write_safetensors(path, {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3], dtype=torch.int16)})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    assert header["b"] == {"dtype": "I16", "shape": [1], "data_offsets": [8, 10]}
    assert raw[8 + n :] == struct.pack("<ffh", 1.0, 2.0, 3)


def test_views_are_zero_copy_slices(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    big = torch.arange(64 * 32, dtype=torch.float32).view(64, 32)
    write_safetensors(path, {"w": big})
    with SafetensorsFile(path) as f:
        view = f.tensor("w")
        assert view.data_ptr() != big.data_ptr()
        # A row block and a column block of the mapping, as a rank's shard would read them.
        assert torch.equal(view[16:32], big[16:32])
        assert torch.equal(view.t()[8:12], big.t()[8:12])
        del view


def test_sharded_checkpoint_index(tmp_path: Path) -> None:
    tensors = random_weights(LLAMA_CONFIG)
    write_checkpoint(tmp_path, LLAMA_CONFIG, tensors, max_shard_bytes=100_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == shard_file_names(len(files))
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in tensors.values())
    ckpt = SafetensorsCheckpoint(tmp_path)
    assert set(ckpt.keys()) == set(tensors)
    seen = []
    for f, names in ckpt.files():
        seen += names
        for name in names:
            assert torch.equal(f.tensor(name), tensors[name])
    assert sorted(seen) == sorted(tensors)
    assert ckpt.info("lm_head.weight").shape == (256, 64)


def test_single_file_checkpoint(tmp_path: Path) -> None:
    tensors = random_weights(LLAMA_CONFIG)
    write_checkpoint(tmp_path, LLAMA_CONFIG, tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    ckpt = SafetensorsCheckpoint(tmp_path)
    assert ckpt.file_names() == ["model.safetensors"]
    assert torch.equal(ckpt.read("model.norm.weight"), tensors["model.norm.weight"])


def test_plan_shards_caps_files() -> None:
    assert plan_shards([("a", 40), ("b", 40), ("c", 40)], 100) == [["a", "b"], ["c"]]
    assert plan_shards([("big", 500), ("a", 1)], 100) == [["big"], ["a"]]  # too big: a file of its own
    assert shard_file_names(1) == ["model.safetensors"]
    assert shard_file_names(3)[1] == "model-00002-of-00003.safetensors"


# --- errors a person can act on -------------------------------------------------------------------


def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"a": torch.zeros(100), "b": torch.zeros(100)})
    raw = path.read_bytes()
    path.write_bytes(raw[:-50])
    with pytest.raises(SafetensorsError, match=r"truncated"):
        SafetensorsFile(path)


def test_tiny_or_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(SafetensorsError, match="shorter than its header"):
        read_header(path)
    path.write_bytes(b"")
    with pytest.raises(SafetensorsError, match="shorter than its header"):
        read_header(path)


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # a zip (a .bin checkpoint), not safetensors
    with pytest.raises(SafetensorsError, match="not a safetensors file, or truncated"):
        read_header(path)


def _with_header(path: Path, header: dict, data: bytes = b"\x00" * 16) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}},
            "needs 8 bytes, data_offsets span 12",
        ),
        ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, "unsupported dtype 'Q4'"),
        ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, "shape must be"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}, "data_offsets must be"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            "overlap",
        ),
        ({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, "truncated"),
        ({"a": "F32"}, "not an object"),
    ],
)
def test_corrupt_header(tmp_path: Path, header: dict, message: str) -> None:
    path = _with_header(tmp_path / "x.safetensors", header)
    with pytest.raises(SafetensorsError, match=message):
        read_header(path)


def test_header_not_json(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{abc!" + b"\x00" * 8)
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        read_header(path)


def test_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(SafetensorsError, match="not a directory"):
        SafetensorsCheckpoint(tmp_path / "nope")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(SafetensorsError, match=r"neither model.safetensors .*\.bin checkpoints are not read"):
        SafetensorsCheckpoint(tmp_path)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(
        SafetensorsError, match=r"names shard 'model-00001-of-00002\.safetensors', which is not"
    ):
        SafetensorsCheckpoint(tmp_path)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(SafetensorsError, match="names shard"):
        SafetensorsCheckpoint(tmp_path)
    assert issubclass(SafetensorsError, WeightsError)


def test_index_and_file_disagree(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model-00001-of-00001.safetensors", {"a": torch.zeros(2)})
    (tmp_path / INDEX_FILE).write_text(
        json.dumps(
            {"weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"}}
        )
    )
    ckpt = SafetensorsCheckpoint(tmp_path)
    with pytest.raises(SafetensorsError, match="has no tensor 'b'"):
        ckpt.info("b")
    with pytest.raises(SafetensorsError, match="lacks"):
        list(ckpt.files())


# --- the `safetensors` package agrees (when installed) --------------------------------------------


def test_package_reads_what_we_write(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    tensors = {k: v for k, v in sample_tensors().items() if k != "scalar"}
    write_safetensors(tmp_path / "t.safetensors", tensors, metadata={"format": "pt"})
    loaded = st.load_file(str(tmp_path / "t.safetensors"))
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert torch.equal(loaded[name], t), name


def test_we_read_what_the_package_writes(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    tensors = sample_tensors()
    st.save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "pt"})
    with SafetensorsFile(tmp_path / "t.safetensors") as f:
        assert f.metadata == {"format": "pt"}
        for name, t in tensors.items():
            assert torch.equal(f.tensor(name), t), name


def test_dtype_table_names() -> None:
    assert DTYPES["BF16"] is torch.bfloat16 and DTYPES["F8_E4M3"] is torch.float8_e4m3fn
