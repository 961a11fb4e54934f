"""A small reader and writer of the safetensors format, with the standard library and torch only.

The runtime ships in launch bundles that run where only torch is installed, so it cannot use the
`safetensors` package. The format (https://github.com/huggingface/safetensors) is simple:

    8 bytes     N, the header length, unsigned little-endian
    N bytes     a JSON object: {"__metadata__": {str: str}, "<tensor name>": {"dtype": "BF16",
                "shape": [4096, 4096], "data_offsets": [begin, end]}, ...}; offsets are relative to
                the byte buffer that follows the header
    the rest    the tensors' raw bytes (little-endian, C order), back to back

Reading maps the file into memory and hands out zero-copy tensors over it (`torch.frombuffer`):
only the bytes a caller copies out are ever read from disk, so a rank that loads its shard of a
parameter touches that shard's rows and nothing else. A checkpoint directory is either one
`model.safetensors` or several files named by `model.safetensors.index.json` ("weight_map":
tensor name -> file), as Hugging Face `save_pretrained` writes them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
for _name, _dtype in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _dtype):  # unsigned wide integers arrived in torch 2.3
        DTYPES[_name] = getattr(torch, _dtype)
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024
"""The `safetensors` package's own limit on the JSON header."""


class WeightsError(ValueError):
    """Pretrained weights that cannot be used as given (unreadable, or another model than the
    plan's); the message says which file or field and what to do."""


class SafetensorsError(WeightsError):
    """A safetensors file or checkpoint directory that cannot be read; the message names the file."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry in a safetensors header."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    """Offset of its first byte in the file (header included)."""
    nbytes: int


class SafetensorsFile:
    """One safetensors file: its header parsed and checked, its bytes memory-mapped on demand.

    `tensor(name)` returns a tensor *viewing* the mapped file (no copy, nothing read yet): slice it
    and copy the slice out. Close the file (or use it as a context manager) once the views are gone.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metadata, self.tensors = read_header(self.path)
        self._file = None
        self._map: mmap.mmap | None = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def keys(self) -> list[str]:
        return list(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor named {name!r}") from None

    def tensor(self, name: str) -> torch.Tensor:
        """A zero-copy view of tensor `name` over the mapped file (read-only by contract)."""
        info = self.info(name)
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=info.dtype)
        if self._map is None:
            self._file = open(self.path, "rb")  # noqa: SIM115  (kept open with the mapping)
            # ACCESS_COPY (a private mapping) is writable as far as Python's buffer protocol goes,
            # which torch.frombuffer wants, yet nothing written would ever reach the file.
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(self._map, dtype=info.dtype, count=math.prod(info.shape), offset=info.begin)
        return flat.view(info.shape)

    def close(self) -> None:
        if self._map is not None:
            # BufferError: a view is still alive somewhere; the mapping goes when the last view does.
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None


def read_header(path: Path) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """Parse and validate the header of safetensors file `path`: (metadata, tensors by name)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(
                    f"{path}: not a safetensors file ({size} bytes, shorter than its header)"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise SafetensorsError(
                    f"{path}: not a safetensors file, or truncated: the header claims {n:,} bytes, "
                    f"the file has {size:,}"
                )
            raw = f.read(n)
    except OSError as exc:
        raise SafetensorsError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{path}: the header is not valid JSON ({exc}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object; the file is corrupt")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError(f"{path}: __metadata__ must be an object of strings")
    data_start = 8 + n
    data_size = size - data_start
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, entry in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise SafetensorsError(f"{where}: header entry is not an object")
        dtype = DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
        if dtype is None:
            raise SafetensorsError(f"{where}: unsupported dtype {entry.get('dtype')!r}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise SafetensorsError(f"{where}: data_offsets must be [begin, end], got {offsets!r}")
        begin, end = offsets
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes:
            raise SafetensorsError(
                f"{where}: {entry['dtype']} {shape} needs {nbytes:,} bytes, data_offsets span {end - begin:,}"
            )
        if end > data_size:
            raise SafetensorsError(
                f"{where}: ends at byte {end:,} of the data, but the file holds {data_size:,} data bytes: "
                "the file is truncated (an interrupted download or copy?)"
            )
        tensors[name] = TensorInfo(name, dtype, tuple(shape), data_start + begin, nbytes)
        spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, a), (begin_b, _, b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise SafetensorsError(f"{path}: tensors {a!r} and {b!r} overlap; the file is corrupt")
    return {str(k): str(v) for k, v in metadata.items()}, tensors


class SafetensorsCheckpoint:
    """A Hugging Face checkpoint directory: `model.safetensors`, or shards named by
    `model.safetensors.index.json`. Files are opened one at a time (`files()`), so a loader can go
    shard by shard and release each mapping before the next."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise SafetensorsError(f"{self.directory}: not a directory")
        index = self.directory / INDEX_FILE
        single = self.directory / SINGLE_FILE
        self.weight_map: dict[str, str]
        if index.is_file():
            try:
                document = json.loads(index.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise SafetensorsError(f"{index}: not readable JSON ({exc})") from None
            weight_map = document.get("weight_map") if isinstance(document, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise SafetensorsError(f"{index}: has no `weight_map` object of tensor name -> file")
            self.weight_map = {str(k): str(v) for k, v in weight_map.items()}
            for file in sorted(set(self.weight_map.values())):
                if Path(file).name != file or not (self.directory / file).is_file():
                    raise SafetensorsError(f"{index}: names shard {file!r}, which is not in {self.directory}")
        elif single.is_file():
            self.weight_map = {name: SINGLE_FILE for name in read_header(single)[1]}
        else:
            found = sorted(p.name for p in self.directory.iterdir())
            hint = (
                "; PyTorch .bin checkpoints are not read: re-save with safe_serialization=True"
                if any(f.endswith(".bin") or f.endswith(".pt") for f in found)
                else ""
            )
            raise SafetensorsError(
                f"{self.directory}: neither {SINGLE_FILE} nor {INDEX_FILE} (found: "
                f"{', '.join(found[:8]) or 'nothing'}){hint}"
            )
        self._headers: dict[str, dict[str, TensorInfo]] = {}

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, name: object) -> bool:
        return name in self.weight_map

    def info(self, name: str) -> TensorInfo:
        file = self.weight_map.get(name)
        if file is None:
            raise SafetensorsError(f"{self.directory}: no tensor named {name!r}")
        if file not in self._headers:
            self._headers[file] = read_header(self.directory / file)[1]
        info = self._headers[file].get(name)
        if info is None:
            raise SafetensorsError(f"{self.directory / file}: has no tensor {name!r} (the index says it has)")
        return info

    def file_names(self) -> list[str]:
        return sorted(set(self.weight_map.values()))

    def files(self) -> Iterator[tuple[SafetensorsFile, list[str]]]:
        """Each file in turn, open, with the tensor names the index assigns to it; closed after."""
        for file in self.file_names():
            names = [n for n, f in self.weight_map.items() if f == file]
            with SafetensorsFile(self.directory / file) as opened:
                missing = [n for n in names if n not in opened.tensors]
                if missing:
                    raise SafetensorsError(f"{opened.path}: lacks {missing[:3]} that the index assigns to it")
                yield opened, names

    def read(self, name: str) -> torch.Tensor:
        """A copy of tensor `name` (for tests and small tensors: a whole tensor in memory)."""
        with SafetensorsFile(self.directory / self.weight_map[name]) as f:
            return f.tensor(name).clone()


# --- writing -------------------------------------------------------------------------------------


def _tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bytes as a flat uint8 CPU tensor (little-endian hosts: all torch targets)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8)


def write_safetensors(
    path: str | Path, tensors: Mapping[str, torch.Tensor], *, metadata: Mapping[str, str] | None = None
) -> int:
    """Write `tensors` to safetensors file `path` (atomically: a temp file renamed); returns its size.

    Tensors go in the order the `safetensors` package uses (larger element size first, then by
    name), so every tensor's offset stays aligned to its element size.
    """
    path = Path(path)
    order = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in order:
        t = tensors[name]
        if t.dtype not in DTYPE_NAMES:
            raise SafetensorsError(f"{name}: dtype {t.dtype} has no safetensors name")
        nbytes = t.numel() * t.dtype.itemsize
        header[name] = {
            "dtype": DTYPE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # pad: the data starts 8-byte aligned
    total = 8 + len(raw) + offset
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w+b") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(total)
        if offset:
            # Copy the tensors' bytes through a writable mapping of the file: no numpy, no copy of
            # the whole model in a bytes object.
            with mmap.mmap(f.fileno(), total) as mapped:
                data = torch.frombuffer(mapped, dtype=torch.uint8, count=offset, offset=8 + len(raw))
                start = 0
                for name in order:
                    src = _tensor_bytes(tensors[name])
                    data[start : start + src.numel()].copy_(src)
                    start += src.numel()
                del data
                mapped.flush()
    os.replace(tmp, path)
    return total


def plan_shards(sizes: Iterable[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Group (name, nbytes) in order into files of at most `max_shard_bytes` each (a tensor larger
    than the cap gets a file of its own), as `save_pretrained(max_shard_size=...)` does."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return [s for s in shards if s]


def shard_file_names(count: int) -> list[str]:
    """`model.safetensors` for one file, else `model-00001-of-0000N.safetensors`..."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_index(directory: Path, weight_map: Mapping[str, str], *, total_size: int) -> Path:
    path = directory / INDEX_FILE
    document = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def write_sharded(directory: Path, tensors: Mapping[str, torch.Tensor], *, max_shard_bytes: int) -> list[str]:
    """Write in-memory `tensors` as Hugging Face safetensors files of at most `max_shard_bytes`
    (`model.safetensors`, or shards + `model.safetensors.index.json`); returns the file names."""
    sizes = [(name, t.numel() * t.element_size()) for name, t in tensors.items()]
    groups = plan_shards(sizes, max_shard_bytes)
    files = shard_file_names(len(groups))
    weight_map: dict[str, str] = {}
    for names, file in zip(groups, files, strict=True):
        write_safetensors(directory / file, {n: tensors[n] for n in names}, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    if len(files) > 1:
        write_index(directory, weight_map, total_size=sum(size for _, size in sizes))
    return files
