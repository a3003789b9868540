"""Read and check a safetensors header before any tensor is read, trusting nothing it says.

Layout: 8 bytes little-endian header length N, N bytes of JSON, then the data region. Each
tensor's [begin, end) must lie inside the data region and match dtype x shape, and tensors may
not overlap. The header length is capped before anything is allocated for it.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lora.errors import SafetensorsHeaderError

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_MAX_DIM = 1 << 31


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


def read_header(path: Path, *, max_header_bytes: int) -> dict[str, TensorEntry]:
    file_size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsHeaderError(f"{path.name} is truncated (no header length)")
        n = int.from_bytes(prefix, "little")
        if n > max_header_bytes:
            raise SafetensorsHeaderError(
                f"{path.name}: the header claims {n} bytes, more than the {max_header_bytes} allowed"
            )
        if 8 + n > file_size:
            raise SafetensorsHeaderError(f"{path.name}: the header runs past the end of the file")
        raw = f.read(n)
    try:
        header = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise SafetensorsHeaderError(f"{path.name}: the header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"{path.name}: the header is not a JSON object")
    header.pop("__metadata__", None)
    data_start = 8 + n
    entries = {name: _entry(name, value, data_start, file_size) for name, value in header.items()}
    spans = sorted((e.begin, e.end, e.name) for e in entries.values())
    for (_, end, _), (begin, _, name) in itertools.pairwise(spans):
        if begin < end:
            raise SafetensorsHeaderError(f"tensor {name[:80]!r} overlaps another tensor's data")
    return entries


def _entry(name: str, value: Any, data_start: int, file_size: int) -> TensorEntry:
    label = repr(name[:80])
    if not isinstance(value, dict) or not {"dtype", "shape", "data_offsets"} <= set(value):
        raise SafetensorsHeaderError(f"tensor {label} has a malformed header entry")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPES:
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
    if end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
        raise SafetensorsHeaderError(
            f"tensor {label}: byte size does not match its shape and dtype"
        )
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def read_tensor(path: Path, entry: TensorEntry) -> torch.Tensor:
    """One tensor's bytes, read at its checked offsets (a fresh CPU tensor)."""
    with path.open("rb") as f:
        f.seek(entry.begin)
        data = bytearray(f.read(entry.end - entry.begin))
    if len(data) != entry.end - entry.begin:
        raise SafetensorsHeaderError(f"tensor {entry.name[:80]!r} is truncated")
    if not data:
        return torch.empty(entry.shape, dtype=DTYPES[entry.dtype])
    return torch.frombuffer(data, dtype=DTYPES[entry.dtype]).reshape(entry.shape)
