"""A prefill chunk's attention in bf16 by the hand-written kernel (kernels/cpu_prefill.cpp,
AVX512-BF16): what `engine.attention.prefill_matmul` computes, in one call that reads the keys
and values from the paged cache and multiplies only the key blocks each tile of queries can see.
The .cpp file states the computation and why.

OpenMP: as for kernels/cpu_native.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from kernels.cpu_native import build

SOURCE = Path(__file__).with_name("cpu_prefill.cpp")
# The softmax rounds as kernels/cpu_layer.cpp's causal_softmax, built the same way.
EXTRA_FLAGS = ("-ffp-contract=off",)
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES: list[Any] = [
    _P,
    _I,
    _I,
    _P,
    _P,
    _I,
    _P,
    _I,
    _I,
    _P,
    _I,
    _I,
    _I,
    ctypes.c_float,
    ctypes.c_int,
]


class NativePrefill:
    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        self.available = bool(lib.prefill_available())
        self._entry = lib.prefill_attention_bf16
        self._entry.argtypes = _ARGTYPES
        self._entry.restype = None
        self.library = library

    def supports(self, dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
        return (
            self.available
            and dtype is torch.bfloat16
            and device.type == "cpu"
            and head_dim % 64 == 0
        )

    def __call__(
        self,
        q: torch.Tensor,  # [query_len, num_heads, head_dim], unit stride within a head
        k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim], contiguous
        v_cache: torch.Tensor,
        slots: torch.Tensor,  # [offset + query_len] int64: each key's slot, this chunk's included
        offset: int,  # tokens of the sequence before this chunk
        scale: float,
    ) -> torch.Tensor:  # [query_len, num_heads, head_dim]
        query_len, num_heads, head_dim = q.shape
        kv_heads, num_slots, _ = k_cache.shape
        if not self.supports(q.dtype, q.device, head_dim):
            raise ValueError(
                f"native prefill attention takes bf16 CPU tensors, head_dim a multiple of 64, on "
                f"AVX512-BF16; got {q.dtype} on {q.device.type}, head_dim {head_dim} "
                f"(available: {self.available})"
            )
        if not (k_cache.dtype == v_cache.dtype == q.dtype):
            raise ValueError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}")
        if q.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("q needs unit stride within a head, the caches contiguous")
        if slots.shape != (offset + query_len,):
            raise ValueError(f"slots must be [offset + query_len] = [{offset + query_len}]")
        if num_heads % kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {kv_heads} KV heads")
        slots = slots.to(torch.int64).contiguous()
        out = torch.empty(query_len, num_heads, head_dim, dtype=q.dtype)
        self._entry(
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            num_slots,
            slots.data_ptr(),
            query_len,
            offset,
            out.data_ptr(),
            num_heads,
            kv_heads,
            head_dim,
            scale,
            torch.get_num_threads(),
        )
        return out


@functools.cache
def native_prefill() -> NativePrefill:
    """The kernel, built on first call. Raises kernels.cpu_native.NativeBuildError where it
    cannot be built; not cached then."""
    return NativePrefill(build(source=SOURCE, extra_flags=EXTRA_FLAGS))
