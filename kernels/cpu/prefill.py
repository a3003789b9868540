"""A prefill chunk's attention by the hand-written kernel (kernels/cpu/native/prefill.cpp): what
`engine.step.attention.prefill_matmul` computes, in one call that reads the keys and values from the
paged cache and multiplies only the key blocks each tile of queries can see. bf16 by
AVX512-BF16, or by AVX2's FMAs (float32 sums); float32 by the FMA path. The .cpp file states
the computation and why.

OpenMP: as for kernels/cpu/rows.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernels.cpu.native.build import build

SOURCE = Path(__file__).parent / "native" / "prefill.cpp"
# The softmax rounds as kernels/cpu/native/layer.cpp's causal_softmax, built the same way.
EXTRA_FLAGS = ("-ffp-contract=off",)
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES: list[Any] = [
    _P,  # q
    _I,
    _I,
    _P,  # k_cache
    _P,
    _I,
    _P,  # table
    _I,
    _P,  # slots
    _P,  # out
    _I,
    _I,
    _I,
    ctypes.c_float,
    ctypes.c_int,
]


@dataclass(frozen=True)
class PrefillChunks:
    """A step's prefill chunks as `NativePrefill.many` takes them, built once for every layer:
    per chunk (first row in the flat batch, rows, tokens before it, where its slots start)."""

    table: torch.Tensor  # [chunks, 4] int64
    slots: torch.Tensor  # the chunks' key slots, one after another, int64
    num_rows: int  # rows the chunks cover, from the first chunk's first
    slot_range: tuple[int, int]  # the lowest and highest slot

    @staticmethod
    def build(chunks: list[tuple[int, int, int, torch.Tensor]]) -> PrefillChunks:
        """chunks: (first row, rows, tokens before, [before + rows] key slots) each."""
        if not chunks:
            raise ValueError("no chunks")
        rows, start = [], 0
        for first, length, before, slots in chunks:
            if first < 0 or length < 1 or before < 0:
                raise ValueError(
                    f"a chunk needs rows from a row >= 0, got {(first, length, before)}"
                )
            if slots.shape != (before + length,):
                raise ValueError(f"a chunk's slots must be [{before + length}]")
            rows.append((first, length, before, start))
            start += before + length
        table = torch.tensor(rows, dtype=torch.int64)
        flat = torch.cat([slots.to(torch.int64) for *_, slots in chunks])
        num_rows = max(first + length for first, length, *_ in chunks)
        return PrefillChunks(table, flat, num_rows, (int(flat.min()), int(flat.max())))


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
        self._many = {
            torch.bfloat16: lib.prefill_attention_many_bf16,
            torch.float32: lib.prefill_attention_many_f32,
        }
        for entry in self._many.values():
            entry.argtypes = _ARGTYPES
            entry.restype = None
        self.library = library

    def supports(self, dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
        available = self.available if dtype is torch.bfloat16 else self.f32_available
        return (
            dtype in self._many
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
        if slots.shape != (offset + query_len,):
            raise ValueError(f"slots must be [offset + query_len] = [{offset + query_len}]")
        out = torch.empty(query_len, num_heads, head_dim, dtype=q.dtype)
        chunks = PrefillChunks.build([(0, query_len, offset, slots)])
        return self.many(q, k_cache, v_cache, chunks, scale, out)

    def many(
        self,
        q: torch.Tensor,  # [rows, num_heads, head_dim], unit stride within a head
        k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim], contiguous
        v_cache: torch.Tensor,
        chunks: PrefillChunks,
        scale: float,
        out: torch.Tensor,  # [rows, num_heads, head_dim] contiguous: each chunk's rows written
    ) -> torch.Tensor:  # out
        """Every chunk's attention in one call (`__call__` is the one-chunk form)."""
        num_rows, num_heads, head_dim = q.shape
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
        if num_heads % kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {kv_heads} KV heads")
        if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor")
        if chunks.num_rows > num_rows:
            raise ValueError(f"the chunks cover {chunks.num_rows} rows, q has {num_rows}")
        if chunks.slot_range[0] < 0 or chunks.slot_range[1] >= num_slots:
            raise ValueError(f"a key slot is outside the cache's {num_slots}")
        self._many[q.dtype](
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            num_slots,
            chunks.table.data_ptr(),
            chunks.table.shape[0],
            chunks.slots.data_ptr(),
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
    """The kernel, built on first call. Raises kernels.cpu.native.build.NativeBuildError where it
    cannot be built; not cached then."""
    return NativePrefill(build(source=SOURCE, extra_flags=EXTRA_FLAGS))
