"""The LoRA short-run kernel (kernels/cpu/native/rows.cpp), built by kernels/cpu/native/build.py
and called through ctypes; kernels/cpu/attention.py and its siblings wrap the other kernels.

The short-run kernel computes what `kernels.cpu.gathered.gathered_rows` states, for bfloat16
and float32 with plain layouts (unit column strides, contiguous stacks: what lora/layers.py
keeps on CPU); any other call goes to the inductor-compiled kernel. Why a C kernel beside the
compiled one: on the decode step of 1,000 adapters (~28 distinct ones over 34 rows) it reads the
adapters' weights ~1.9x faster a step and a call costs a few microseconds against inductor's
~20-30 (48 calls a step); bench/RESULTS.md has the figures.

OpenMP: the library links the `libgomp.so.1` soname, which resolves to the one PyTorch has
already loaded, so the kernel's threads are PyTorch's; it is told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from kernels.cpu.gathered import GatheredKernel, compiled_gathered_rows, gathered_rows
from kernels.cpu.native.build import NativeBuildError, NoCompilerError, build, load_entries

SOURCE = Path(__file__).parent / "native" / "rows.cpp"
_ENTRIES = {torch.bfloat16: "lora_rows_bf16", torch.float32: "lora_rows_f32"}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [_P, _I, _P, _I, _P, _P, _I, _P, _I, _P, _I, _P, _P, _I, _I, _I]
_RUNS_ARGTYPES: list[Any] = [_P, _I, _P, _I, _P, _I, _P, _I, _P, _I, _P, _P, _I, _I, _I]
# rows.cpp holds a row's shrink output on the stack: n * rank <= 3 * 256 floats
MAX_FUSED_RANK = 3 * 256


class NativeRows:
    """A GatheredKernel: the C kernel where its preconditions hold, `fallback` elsewhere."""

    def __init__(self, library: Path, fallback: GatheredKernel | None = None):
        self._entries = load_entries(library, _ENTRIES, _ARGTYPES)
        # runs in tiles (lora_runs.h): bf16 where the CPU has AVX512-BF16 or AVX2 + FMA
        lib = ctypes.CDLL(str(library))
        self._runs = lib.lora_runs_bf16 if lib.lora_runs_available() else None
        if self._runs is not None:
            self._runs.argtypes, self._runs.restype = _RUNS_ARGTYPES, None
        self._fallback = fallback
        self._subs: dict[tuple[tuple[int, int], ...], torch.Tensor] = {}
        self.library = library

    def fallback(self) -> GatheredKernel:
        return self._fallback if self._fallback is not None else compiled_gathered_rows()

    @property
    def runs_bf16(self) -> bool:
        """Whether `run_segments` takes bf16 calls here (the CPU has AVX512-BF16 or AVX2 +
        FMA)."""
        return self._runs is not None

    def runs_natively(self, x: torch.Tensor, out: torch.Tensor, lora_a: torch.Tensor,
                      lora_b_rows: torch.Tensor) -> bool:  # fmt: skip
        return (
            lora_a.shape[1] <= MAX_FUSED_RANK  # n * rank: the stacks' fused rank rows
            and x.dtype in self._entries
            and x.dtype == out.dtype == lora_a.dtype == lora_b_rows.dtype
            and x.device.type == "cpu"
            and x.dim() == out.dim() == 2
            and x.stride(1) == 1
            and out.stride(1) == 1
            and lora_a.is_contiguous()
            and lora_b_rows.is_contiguous()
        )

    def run_segments(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        segments: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b_rows: torch.Tensor,
        slot_ranks: torch.Tensor,
        subs: tuple[tuple[int, int], ...],
        rank: int,
    ) -> bool:
        """Every run of `segments` ([K, 3] int64 (start, end, slot), rows consecutive) in one
        call of the tiled kernel, long runs and short alike; False (nothing done) where that
        kernel does not take the call (not bf16, neither AVX512-BF16 nor AVX2 + FMA, another
        layout): the caller then runs long runs by matmuls and short ones by `__call__`."""
        if (
            self._runs is None
            or x.dtype is not torch.bfloat16
            or not self.runs_natively(x, out, lora_a, lora_b_rows)
        ):
            return False
        slot_ranks = slot_ranks.to(torch.int32).contiguous()
        self._runs(
            x.data_ptr(),
            x.stride(0),
            out.data_ptr(),
            out.stride(0),
            segments.data_ptr(),
            segments.shape[0],
            lora_a.data_ptr(),
            lora_a.shape[2],
            lora_b_rows.data_ptr(),
            lora_b_rows.shape[2],
            slot_ranks.data_ptr(),
            self._sub_table(subs).data_ptr(),
            len(subs),
            rank,
            torch.get_num_threads(),
        )
        return True

    def _sub_table(self, subs: tuple[tuple[int, int], ...]) -> torch.Tensor:
        table = self._subs.get(subs)
        if table is None:  # a handful of distinct tuples per model: kept
            table = self._subs[subs] = torch.tensor(subs, dtype=torch.int64).reshape(-1)
        return table

    def __call__(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        slots: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b_rows: torch.Tensor,
        slot_ranks: torch.Tensor,
        subs: tuple[tuple[int, int], ...],
        rank: int,
    ) -> None:
        if not self.runs_natively(x, out, lora_a, lora_b_rows):
            self.fallback()(x, out, rows, slots, lora_a, lora_b_rows, slot_ranks, subs, rank)
            return
        table = self._sub_table(subs)
        # the index tensors come from kernels/cpu/plan.py (int64) and LoRAKernelMeta (int32)
        rows, slots = rows.contiguous(), slots.contiguous()
        slot_ranks = slot_ranks.to(torch.int32).contiguous()
        self._entries[x.dtype](
            x.data_ptr(),
            x.stride(0),
            out.data_ptr(),
            out.stride(0),
            rows.data_ptr(),
            slots.data_ptr(),
            rows.numel(),
            lora_a.data_ptr(),
            lora_a.shape[2],
            lora_b_rows.data_ptr(),
            lora_b_rows.shape[2],
            slot_ranks.data_ptr(),
            table.data_ptr(),
            len(subs),
            rank,
            torch.get_num_threads(),
        )


@functools.cache
def native_rows() -> NativeRows:
    """The C kernel, built on first call (well under a second with gcc -O3). Raises
    NativeBuildError where it cannot be built; not cached then, so callers keep their choice."""
    return NativeRows(build(source=SOURCE))


@functools.cache
def default_rows_kernel() -> GatheredKernel:
    """What `kernels.cpu.reference.lora_add_cpu` runs when not told: the C kernel, else
    inductor's, else (no C++ compiler, which inductor needs too) the same kernel eager."""
    try:
        return native_rows()
    except NoCompilerError:
        return gathered_rows
    except NativeBuildError:
        return compiled_gathered_rows()
