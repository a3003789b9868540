"""Read a LoRA pair's values as float32, fold the PEFT scale into B, and refuse what is not
finite or leaves the float16 range.

Serving computes x @ A.T @ B.T with B already scaled, so the range is checked on A and on
B times the module's scale: a B that only overflows once scaled is refused too. The float16
range (+-65504) is the bound because no model dtype then turns an accepted weight into inf,
which would make the adapter answer NaN logits on every request; real LoRA weights are many
orders of magnitude smaller, and a clear 400 at upload or load beats garbage tokens later.

Without torch: F32 and F16 are numpy dtypes; BF16 is the top half of a float32, so its uint16
bits shifted left by 16 are that float32 exactly. One pair is in memory at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lora.adapter_format.lora_tensors import TensorPair
from lora.adapter_format.safetensors_header import TensorEntry, WeightsSource
from lora.errors import AdapterTensorError, SafetensorsHeaderError

MAX_WEIGHT_MAGNITUDE = 65504.0


@dataclass(frozen=True)
class LoraArrays:
    """One projection's LoRA pair, float32, owned and C-contiguous."""

    layer: int
    module: str
    lora_a: np.ndarray  # [rank, in_features]
    lora_b: np.ndarray  # [out_features, rank], the PEFT scale already folded in


def read_float32(source: WeightsSource, entry: TensorEntry) -> np.ndarray:
    """One tensor's values, widened to float32 (exactly: F16 and BF16 fit in it)."""
    raw = source.read(entry.begin, entry.end)
    if len(raw) != entry.end - entry.begin:
        raise SafetensorsHeaderError(f"tensor {entry.name[:80]!r} is truncated")
    if entry.dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32)
    else:
        values = np.frombuffer(raw, dtype="<f4" if entry.dtype == "F32" else "<f2")
        values = values.astype(np.float32)  # a copy: owned and writable
    return values.reshape(entry.shape)


def check_in_range(name: str, values: np.ndarray, *, what: str = "") -> None:
    """AdapterTensorError naming the tensor unless every value is finite and within +-65504."""
    if values.size == 0:
        return
    problem = None
    if np.isnan(values).any():
        problem = "NaN"
    elif np.isinf(values).any():
        problem = "inf"
    else:
        largest = float(np.abs(values).max())
        if largest > MAX_WEIGHT_MAGNITUDE:
            problem = f"a value of magnitude {largest:g}"
    if problem is not None:
        raise AdapterTensorError(
            f"tensor {name[:100]!r}{what}: LoRA weights must be finite and within "
            f"+-{MAX_WEIGHT_MAGNITUDE:g} (float16's range); it holds {problem}"
        )


def read_pair(source: WeightsSource, pair: TensorPair, scale: float) -> LoraArrays:
    lora_a = read_float32(source, pair.lora_a)  # [r, in]
    check_in_range(pair.lora_a.name, lora_a)
    lora_b = read_float32(source, pair.lora_b)  # [out, r]
    with np.errstate(over="ignore"):  # an overflow to inf is refused just below, by name
        lora_b *= np.float32(scale)
    check_in_range(pair.lora_b.name, lora_b, what=f" times its scale {scale:g}")
    return LoraArrays(pair.layer, pair.module, lora_a, lora_b)
