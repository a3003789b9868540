"""Matmuls in bfloat16 by the hand-written kernel (kernels/cpu_matmul.cpp, AVX512-BF16):
y = x W^T + b over a weight packed once into the kernel's layout, for any number of rows.
engine/packed_linear.py uses it beside or instead of oneDNN's packed weight where a start-up
timing says it pays (engine/native_matmul.py); the .cpp file says why and what it computes.

OpenMP: as for kernels/cpu_native.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from kernels import huge_pages
from kernels.cpu_native import build

SOURCE = Path(__file__).with_name("cpu_matmul.cpp")
COLS = 64  # outputs per packed block
_P, _I = ctypes.c_void_p, ctypes.c_int64


def packed_size(n: int, k: int) -> int:
    """Values in the packed form of an [n, k] weight: outputs padded to blocks of 64."""
    return -(-n // COLS) * COLS * k


def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The plain [n, k] weight back from the kernel's layout ([n / 64][k / 2][64][2])."""
    blocks = -(-n // COLS)
    return packed.view(blocks, k // 2, COLS, 2).permute(0, 2, 1, 3).reshape(blocks * COLS, k)[:n]


class NativeMatmul:
    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        self.available = bool(lib.matmul_available())
        self._pack = lib.matmul_pack_bf16
        self._pack.argtypes = [_P, _I, _I, _P]
        self._pack.restype = None
        self._matmul = lib.matmul_bf16
        self._matmul.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _I, ctypes.c_int]
        self._matmul.restype = None
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
        """[n, k] -> the kernel's layout, `packed_size(n, k)` bf16 values (outputs past n zero)."""
        if not self.packs(weight):
            raise ValueError(
                f"the matmul kernel packs bf16 [n, even k] CPU weights on AVX512-BF16, got "
                f"{weight.dtype} {tuple(weight.shape)} on {weight.device.type} "
                f"(available: {self.available})"
            )
        n, k = weight.shape
        plain = weight.detach().contiguous()
        # huge pages: at a few rows the kernel streams every weight, and the CPU's prefetchers
        # stop at page boundaries
        packed = huge_pages.empty((packed_size(n, k),), torch.bfloat16)
        self._pack(plain.data_ptr(), n, k, packed.data_ptr())
        return packed

    def __call__(
        self,
        x: torch.Tensor,  # [rows, k] bf16, unit stride within a row
        packed: torch.Tensor,  # from `pack` of an [n, k] weight
        n: int,
        bias: torch.Tensor | None = None,  # [n] bf16, contiguous
    ) -> torch.Tensor:  # [rows, n] bf16
        if x.dim() != 2 or x.dtype is not torch.bfloat16:
            raise ValueError(
                f"the matmul kernel takes [rows, k] bf16, got {x.dtype} {tuple(x.shape)}"
            )
        rows, k = x.shape
        if x.stride(1) != 1 or x.stride(0) < k:
            x = x.contiguous()
        if packed.numel() != packed_size(n, k):
            raise ValueError(f"packed weight of {packed.numel()} values is not [{n}, {k}]")
        if bias is not None and not (bias.is_contiguous() and bias.shape == (n,)):
            raise ValueError(f"bias must be contiguous [{n}]")
        if bias is not None and bias.dtype is not torch.bfloat16:
            raise ValueError(f"bias must be bf16, got {bias.dtype}")
        y = torch.empty(rows, n, dtype=torch.bfloat16)
        if rows == 0:
            return y
        self._matmul(
            x.data_ptr(),
            rows,
            x.stride(0),
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
def native_matmul() -> NativeMatmul:
    """The kernel, built on first call. Raises kernels.cpu_native.NativeBuildError where it
    cannot be built; not cached then."""
    return NativeMatmul(build(source=SOURCE))
