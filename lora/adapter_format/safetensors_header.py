"""Read and check a safetensors header before any tensor is read, trusting nothing it says.

Layout: 8 bytes little-endian header length N, N bytes of JSON, then the data region. Each
tensor's [begin, end) lies inside the data region and matches dtype x shape; the header length
is capped before anything is allocated for it.

The tensors tile the data region exactly: no overlap, no gap, nothing after the last tensor.
The loader alone would only need "no overlap", but the reference `safetensors` library (what
PEFT and vLLM load adapters with, so what an HTTP-mode vLLM engine runs on an upload) refuses
gaps and trailing bytes, and the format forbids them so a file cannot also be something else
(a polyglot). A file accepted here is one every reader of the format accepts.

The bytes come from a `WeightsSource`: the upload's bytes in memory, or an open file for the
loader; both are read by range, so nothing here holds more than the header.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from io import BufferedIOBase
from typing import Any, Protocol

from lora.errors import SafetensorsHeaderError

WEIGHTS_FILE = "adapter_model.safetensors"
# The dtypes a LoRA weight may have; everything is served in float32 or the model's dtype.
DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}
_MAX_DIM = 1 << 31


class WeightsSource(Protocol):
    """The bytes of one safetensors file, read by range."""

    @property
    def size(self) -> int: ...

    def read(self, begin: int, end: int) -> bytes | bytearray | memoryview:
        """Bytes [begin, end), fewer if the file ends first."""
        ...


@dataclass(frozen=True)
class BytesSource:
    """An upload, already in memory (bounded by the upload limits); reads are views."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, begin: int, end: int) -> memoryview:
        return memoryview(self.data)[begin:end]


@dataclass(frozen=True)
class FileSource:
    """An open file of a known size; each read is a fresh, writable buffer."""

    file: BufferedIOBase
    size: int

    def read(self, begin: int, end: int) -> bytearray:
        self.file.seek(begin)
        buffer = bytearray(max(0, min(end, self.size) - begin))
        num_read = self.file.readinto(buffer)
        return buffer[:num_read] if num_read != len(buffer) else buffer


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsHeaderError(f"the safetensors header repeats {key[:80]!r}")
        out[key] = value
    return out


def read_header(source: WeightsSource, *, max_header_bytes: int) -> dict[str, TensorEntry]:
    prefix = bytes(source.read(0, 8))
    if len(prefix) < 8:
        raise SafetensorsHeaderError(f"{WEIGHTS_FILE} is truncated (no header length)")
    n = int.from_bytes(prefix, "little")
    if n > max_header_bytes:
        raise SafetensorsHeaderError(
            f"{WEIGHTS_FILE}: the header claims {n} bytes, more than the {max_header_bytes} allowed"
        )
    if 8 + n > source.size:
        raise SafetensorsHeaderError(f"{WEIGHTS_FILE}: the header runs past the end of the file")
    try:
        header = json.loads(bytes(source.read(8, 8 + n)), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise SafetensorsHeaderError(f"{WEIGHTS_FILE}: the header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"{WEIGHTS_FILE}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise SafetensorsHeaderError(f"{WEIGHTS_FILE}: __metadata__ must map strings to strings")
    data_start = 8 + n
    entries = {name: _entry(name, value, data_start, source.size) for name, value in header.items()}
    _check_tiling(entries.values(), data_start, source.size)
    return entries


def _entry(name: str, value: Any, data_start: int, file_size: int) -> TensorEntry:
    label = repr(name[:80])
    if not isinstance(value, dict) or not {"dtype", "shape", "data_offsets"} <= set(value):
        raise SafetensorsHeaderError(f"tensor {label} has a malformed header entry")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise SafetensorsHeaderError(
            f"tensor {label} has dtype {str(dtype)[:16]!r}, not F32/F16/BF16"
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM for d in shape
    ):
        raise SafetensorsHeaderError(f"tensor {label} has an invalid shape")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise SafetensorsHeaderError(f"tensor {label} has invalid data offsets")
    begin, end = data_start + offsets[0], data_start + offsets[1]
    if not data_start <= begin <= end <= file_size:
        raise SafetensorsHeaderError(f"tensor {label} has data offsets past the end of the file")
    if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
        raise SafetensorsHeaderError(
            f"tensor {label}: byte size does not match its shape and dtype"
        )
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def _check_tiling(entries: Iterable[TensorEntry], data_start: int, file_size: int) -> None:
    cursor = data_start
    for begin, end, name in sorted((e.begin, e.end, e.name) for e in entries):
        if begin < cursor:
            raise SafetensorsHeaderError(f"tensor {name[:80]!r} overlaps another tensor's data")
        if begin > cursor:
            raise SafetensorsHeaderError(
                f"tensor {name[:80]!r} leaves a gap in the data region before it"
            )
        cursor = end
    if cursor != file_size:
        raise SafetensorsHeaderError(
            f"{WEIGHTS_FILE} has {file_size - cursor} bytes after its last tensor"
        )
