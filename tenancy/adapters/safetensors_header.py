"""Parse a safetensors header without loading tensors, trusting nothing it says.

Layout: 8 bytes little-endian header length N, N bytes of JSON, then the data region. Each
tensor's [begin, end) lies inside the data region, matches dtype x shape, and the tensors tile
the region exactly (no overlaps, no gaps, nothing past the end).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tenancy.adapters.errors import AdapterRejected

DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
_MAX_DIM = 1 << 31


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise AdapterRejected(f"The safetensors header repeats {key[:80]!r}.")
        out[key] = value
    return out


def parse_header(data: bytes, *, max_header_bytes: int) -> list[TensorInfo]:
    if len(data) < 8:
        raise AdapterRejected("adapter_model.safetensors is truncated.")
    n = int.from_bytes(data[:8], "little")
    if n > max_header_bytes:
        raise AdapterRejected("The safetensors header is larger than allowed.")
    if 8 + n > len(data):
        raise AdapterRejected("The safetensors header runs past the end of the file.")
    try:
        header = json.loads(data[8 : 8 + n], object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise AdapterRejected("The safetensors header is not valid JSON.") from exc
    if not isinstance(header, dict):
        raise AdapterRejected("The safetensors header is not an object.")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise AdapterRejected("The safetensors __metadata__ must map strings to strings.")
    data_len = len(data) - 8 - n
    spans: list[tuple[int, int, str]] = []
    tensors: list[TensorInfo] = []
    for name, entry in header.items():
        tensors.append(_tensor(name, entry, data_len, spans))
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            raise AdapterRejected(f"Tensor {name[:80]!r} overlaps or leaves a gap in the data.")
        cursor = end
    if cursor != data_len:
        raise AdapterRejected("The safetensors data region does not match its header.")
    return tensors


def _tensor(name: str, entry: Any, data_len: int, spans: list[tuple[int, int, str]]) -> TensorInfo:
    label = repr(name[:80])
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise AdapterRejected(f"Tensor {label} has a malformed header entry.")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise AdapterRejected(f"Tensor {label} has an unknown dtype.")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM for d in shape
    ):
        raise AdapterRejected(f"Tensor {label} has an invalid shape.")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise AdapterRejected(f"Tensor {label} has invalid data offsets.")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise AdapterRejected(f"Tensor {label} has offsets past the end of the file.")
    if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
        raise AdapterRejected(f"Tensor {label} byte size does not match its shape and dtype.")
    spans.append((begin, end, name))
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape))
