"""A prefill chunk's attention by the hand-written kernel (kernels/cpu_prefill.cpp): what
`engine.attention.prefill_matmul` computes, in one call that reads the keys and values from the
paged cache and multiplies only the key blocks each tile of queries can see. bf16 by
AVX512-BF16, or by AVX2's FMAs (float32 sums); float32 by the FMA path. The .cpp file states
the computation and why.

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
        self.available = bool(lib.prefill_available())  # bf16
        self.f32_available = bool(lib.prefill_f32_available())
        # head_dim multiple of each dtype's path: 64 for AVX512-BF16's, 16 for the FMA path's
        self._head_dim_multiple = {
            torch.bfloat16: int(lib.prefill_head_dim_multiple()),
            torch.float32: 16,
        }
        self._entries = {
            torch.bfloat16: lib.prefill_attention_bf16,
            torch.float32: lib.prefill_attention_f32,
        }
        for entry in self._entries.values():
            entry.argtypes = _ARGTYPES
            entry.restype = None
        self.library = library

    def supports(self, dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
        available = self.available if dtype is torch.bfloat16 else self.f32_available
        return (
            dtype in self._entries
            and available
            and device.type == "cpu"
            and head_dim % self._head_dim_multiple[dtype] == 0
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
                f"native prefill attention takes bf16 (AVX512-BF16: head_dim a multiple of 64; "
                f"AVX2 + FMA: of 16) or float32 (AVX2 + FMA) CPU tensors; got {q.dtype} on "
                f"{q.device.type}, head_dim {head_dim} (bf16: {self.available}, float32: "
                f"{self.f32_available})"
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
        self._entries[q.dtype](
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
