"""Hostile variants of a real adapter directory: rewritten configs and lying safetensors files."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

from safetensors import safe_open

_DTYPE_NAMES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16"}


def copy_adapter(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def read_tensors(adapter_dir: Path) -> dict[str, Any]:
    out = {}
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            out[name] = f.get_tensor(name).clone()  # not a view of the mmap: files get rewritten
    return out


def write_raw_safetensors(
    path: Path,
    tensors: dict[str, Any],
    *,
    shape_override: dict[str, list[int]] | None = None,
    offset_shift: dict[str, int] | None = None,
    header_len_override: int | None = None,
    truncate_by: int = 0,
) -> None:
    """Serialize by hand so the header can lie about shapes, offsets or its own length."""
    header: dict[str, Any] = {}
    data = b""
    for name, tensor in tensors.items():
        raw = tensor.contiguous().numpy().tobytes()
        begin, end = len(data), len(data) + len(raw)
        shift = (offset_shift or {}).get(name, 0)
        header[name] = {
            "dtype": _DTYPE_NAMES[str(tensor.dtype)],
            "shape": (shape_override or {}).get(name, list(tensor.shape)),
            "data_offsets": [begin + shift, end + shift],
        }
        data += raw
    blob = json.dumps(header).encode()
    n = header_len_override if header_len_override is not None else len(blob)
    payload = struct.pack("<Q", n) + blob + data
    path.write_bytes(payload[: len(payload) - truncate_by] if truncate_by else payload)
