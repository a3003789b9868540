"""Matmuls of a decode step's few rows (1-4) in bfloat16 by the hand-written kernel
(kernels/cpu_gemv.cpp, AVX512-BF16): y = x W^T + b over a weight packed once into the kernel's
layout. engine/packed_linear.py uses it (for 1-2 rows) beside oneDNN's packed weight where a
start-up timing says it pays; the .cpp file says why and what it computes.

OpenMP: as for kernels/cpu_native.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from kernels.cpu_native import build

SOURCE = Path(__file__).with_name("cpu_gemv.cpp")
MAX_ROWS = 4  # the kernel's register tile: a call with more rows is refused
COLS = 64  # outputs per packed block
_P, _I = ctypes.c_void_p, ctypes.c_int64


class NativeGemv:
    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        self.available = bool(lib.gemv_available())
        self._pack = lib.gemv_pack_bf16
        self._pack.argtypes = [_P, _I, _I, _P]
        self._pack.restype = None
        self._gemv = lib.gemv_bf16
        self._gemv.argtypes = [_P, _I, _I, _P, _P, _I, _P, _I, ctypes.c_int]
        self._gemv.restype = None
        self.library = library

    def packs(self, weight: torch.Tensor) -> bool:
        """Whether `pack` takes this weight: bf16 [n, k] on the CPU, k even, and the CPU has
        the instructions."""
        return (
            self.available
            and weight.dtype is torch.bfloat16
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and weight.shape[1] % 2 == 0
        )

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[n, k] -> the kernel's layout, [ceil(n / 64) * k * 64] bf16 (outputs past n zero)."""
        if not self.packs(weight):
            raise ValueError(
                f"gemv packs bf16 [n, even k] CPU weights on AVX512-BF16, got {weight.dtype} "
                f"{tuple(weight.shape)} on {weight.device.type} (available: {self.available})"
            )
        n, k = weight.shape
        plain = weight.detach().contiguous()
        packed = torch.empty(-(-n // COLS) * COLS * k, dtype=torch.bfloat16)
        self._pack(plain.data_ptr(), n, k, packed.data_ptr())
        return packed

    def __call__(
        self,
        x: torch.Tensor,  # [rows <= 4, k] bf16
        packed: torch.Tensor,  # from `pack` of an [n, k] weight
        n: int,
        bias: torch.Tensor | None = None,  # [n] bf16, contiguous
    ) -> torch.Tensor:  # [rows, n] bf16
        rows, k = x.shape
        if not (1 <= rows <= MAX_ROWS and x.dtype is torch.bfloat16):
            raise ValueError(f"gemv takes 1-{MAX_ROWS} bf16 rows, got {x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        if packed.numel() != -(-n // COLS) * COLS * k:
            raise ValueError(f"packed weight of {packed.numel()} values is not [{n}, {k}]")
        if bias is not None and not (bias.is_contiguous() and bias.shape == (n,)):
            raise ValueError(f"bias must be contiguous [{n}]")
        if bias is not None and bias.dtype is not torch.bfloat16:
            raise ValueError(f"bias must be bf16, got {bias.dtype}")
        y = torch.empty(rows, n, dtype=torch.bfloat16)
        self._gemv(
            x.data_ptr(),
            rows,
            k,
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            n,
            y.data_ptr(),
            n,
            torch.get_num_threads(),
        )
        return y


@functools.cache
def native_gemv() -> NativeGemv:
    """The kernel, built on first call. Raises kernels.cpu_native.NativeBuildError where it
    cannot be built; not cached then."""
    return NativeGemv(build(source=SOURCE))
