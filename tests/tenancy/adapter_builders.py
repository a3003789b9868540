"""Builders of adapter uploads for the tests: a real PEFT adapter, and hostile variants."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np


def make_peft_adapter(
    out: Path,
    *,
    base_name: str = "loragate/tiny",
    r: int = 8,
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, float] | None = None,
) -> Path:
    """A LoRA adapter saved by PEFT itself, on a tiny Llama built from a config."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    cfg._name_or_path = base_name
    model = get_peft_model(
        LlamaForCausalLM(cfg),
        LoraConfig(
            r=r,
            lora_alpha=2 * r,
            target_modules=["q_proj", "v_proj", "down_proj"],
            rank_pattern=rank_pattern or {},
            alpha_pattern=alpha_pattern or {},
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(str(out), save_embedding_layers=False)
    return out


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], **header_extra: Any) -> bytes:
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}.get(dtype, 4)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header.update(header_extra)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


def read_arrays(weights: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, as float32 arrays (writable copies)."""
    from safetensors.numpy import load

    return {name: array.astype(np.float32) for name, array in load(weights).items()}


def arrays_safetensors(arrays: dict[str, np.ndarray], *, dtype: str = "F32") -> bytes:
    """Serialized by hand in F32, F16 or BF16 (numpy has no bfloat16: the top half of each
    float32, so NaN and inf stay what they are)."""
    header: dict[str, Any] = {}
    data = b""
    for name, array in arrays.items():
        values = np.ascontiguousarray(array, dtype="<f4")
        if dtype == "BF16":
            raw = (values.view("<u4") >> 16).astype("<u2").tobytes()
        else:
            raw = values.astype("<f2" if dtype == "F16" else "<f4").tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


def zip_bytes(entries: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            z.writestr(info, target)
    return buf.getvalue()


def targz_bytes(entries: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            t.addfile(info)
    return buf.getvalue()


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="lg-adapter-"))
