"""Decode attention over the paged KV cache by the hand-written kernel (kernels/cpu/native/attention.cpp).

`NativePagedDecode` computes, for one query row per sequence, what `engine.step.attention.
decode_matmul` computes after the eager path has gathered each row's blocks (the .cpp file
states it), reading every key and value where it lies in the cache. bfloat16 and float32 on
the CPU; the caller keeps its eager path for everything else (`supports`).

OpenMP: as for kernels/cpu/rows.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from kernels.cpu.native.build import build, load_entries

SOURCE = Path(__file__).parent / "native" / "attention.cpp"
_ENTRIES = {torch.bfloat16: "paged_decode_bf16", torch.float32: "paged_decode_f32"}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [_P, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I, _I, _I, _I, _I, ctypes.c_float, _I]


class NativePagedDecode:
    def __init__(self, library: Path):
        self._entries = load_entries(library, _ENTRIES, _ARGTYPES)
        self.library = library

    def supports(self, dtype: torch.dtype, device: torch.device) -> bool:
        return dtype in self._entries and device.type == "cpu"

    def __call__(
        self,
        q: torch.Tensor,  # [rows, num_heads, head_dim], unit stride within a head
        k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim], contiguous
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [rows, max_blocks] int64
        lengths: torch.Tensor,  # [rows] int64, each >= 1: context length, this token included
        block_size: int,
        scale: float,
    ) -> torch.Tensor:  # [rows, num_heads, head_dim]
        rows, num_heads, head_dim = q.shape
        kv_heads, num_slots, _ = k_cache.shape
        if not self.supports(q.dtype, q.device):
            raise ValueError(f"no native decode attention for {q.dtype} on {q.device}")
        if q.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("q needs unit stride within a head, the caches contiguous")
        if not q.dtype == k_cache.dtype == v_cache.dtype:
            raise ValueError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}")
        tables = block_tables.to(torch.int64).contiguous()
        lengths = lengths.to(torch.int64).contiguous()
        out = torch.empty(rows, num_heads, head_dim, dtype=q.dtype)
        self._entries[q.dtype](
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            num_slots,
            tables.data_ptr(),
            tables.stride(0),
            lengths.data_ptr(),
            out.data_ptr(),
            rows,
            num_heads,
            kv_heads,
            head_dim,
            block_size,
            scale,
            torch.get_num_threads(),
        )
        return out


@torch.library.custom_op("loragate::paged_decode_native", mutates_args=())
def paged_decode_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """The kernel as an operator torch.compile can place in a graph (engine/step/compile_decode.py):
    inductor compiles the code around it and calls it as it is."""
    return native_paged_decode()(q, k_cache, v_cache, block_tables, lengths, block_size, scale)


# What the compiler needs to know of a call: the output's shape and dtype (q's).
paged_decode_op.register_fake(lambda q, *_: q.new_empty(q.shape))


@functools.cache
def native_paged_decode() -> NativePagedDecode:
    """The kernel, built on first call. Raises kernels.cpu.native.build.NativeBuildError where it
    cannot be built; not cached then."""
    return NativePagedDecode(build(source=SOURCE))
