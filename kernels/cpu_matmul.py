"""Matmuls in bfloat16 by the hand-written kernel (kernels/cpu_matmul.cpp, AVX512-BF16, and
AMX where the CPU has it): y = x W^T + b over a weight packed once into the kernel's layout
(AMX's for input widths that are a multiple of 32 where it runs: `tiled`), for any number of
rows.
engine/packed_linear.py uses it beside or instead of oneDNN's packed weight where a start-up
timing says it pays (engine/native_matmul.py); the .cpp file says why and what it computes.

OpenMP: as for kernels/cpu_native.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from kernels import huge_pages
from kernels.cpu_native import build

SOURCE = Path(__file__).with_name("cpu_matmul.cpp")
# The fused SiLU rounds as kernels/cpu_layer.cpp's silu_mul, built the same way.
EXTRA_FLAGS = ("-ffp-contract=off",)
COLS = 64  # outputs per packed block
TILE_COLS = 16  # outputs per column tile of the AMX layout
GATE_UP_GROUP = COLS // 2  # gate outputs (and as many up outputs) in one block of the fused form
_P, _I = ctypes.c_void_p, ctypes.c_int64


def packed_size(n: int, k: int) -> int:
    """Values in the packed form of an [n, k] weight: outputs padded to blocks of 64."""
    return -(-n // COLS) * COLS * k


def unpack(packed: torch.Tensor, n: int, k: int, *, tiled: bool = False) -> torch.Tensor:
    """The plain [n, k] weight back from the kernel's layout: [n / 64][k / 2][64][2], or
    `tiled` (AMX) [n / 64][4][k / 2][16][2]."""
    blocks = -(-n // COLS)
    tile = TILE_COLS if tiled else COLS
    view = packed.view(blocks, COLS // tile, k // 2, tile, 2)
    return view.permute(0, 1, 3, 2, 4).reshape(blocks * COLS, k)[:n]


def interleave_gate_up(t: torch.Tensor, width: int) -> torch.Tensor:
    """Rows [gate 0..width) + [up 0..width) of a fused gate/up weight (or bias) reordered as
    gate 0..31, up 0..31, gate 32..63, up 32..63, ...: the order `silu` takes them in."""
    rest = t.shape[1:]
    groups = t.reshape(2, width // GATE_UP_GROUP, GATE_UP_GROUP, *rest)
    return groups.transpose(0, 1).reshape(2 * width, *rest)


def deinterleave_gate_up(t: torch.Tensor, width: int) -> torch.Tensor:
    """The inverse of `interleave_gate_up` (a weight's rows, a bias)."""
    rest = t.shape[1:]
    groups = t.reshape(width // GATE_UP_GROUP, 2, GATE_UP_GROUP, *rest)
    return groups.transpose(0, 1).reshape(2 * width, *rest)


def deinterleave_outputs(y: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, 2 * width] outputs of a matmul by an interleaved weight back in [gate | up] order."""
    rows = y.shape[0]
    groups = y.view(rows, width // GATE_UP_GROUP, 2, GATE_UP_GROUP)
    return groups.transpose(1, 2).reshape(rows, 2 * width)


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
        self._silu = lib.matmul_silu_bf16
        self._silu.argtypes = self._matmul.argtypes
        self._silu.restype = None
        self._tiled = lib.matmul_tiled
        self._tiled.argtypes = [_I]
        self._tiled.restype = ctypes.c_int
        # whether steps run on AMX's tiles (weights whose input width is a multiple of 32)
        self.amx = self.available and bool(lib.matmul_amx())
        self.library = library

    def tiled(self, k: int) -> bool:
        """Whether a weight of `k` inputs is packed for AMX (see `unpack`)."""
        return bool(self._tiled(k))

    def unpack(self, packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """The plain [n, k] weight back from `pack`'s copy."""
        return unpack(packed, n, k, tiled=self.tiled(k))

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
        return self._run(self._matmul, x, packed, n, n, bias)

    def silu(
        self,
        x: torch.Tensor,  # [rows, k] bf16
        packed: torch.Tensor,  # from `pack` of an interleaved (interleave_gate_up) [2 w, k] weight
        width: int,  # w, a multiple of 32
        bias: torch.Tensor | None = None,  # [2 w] bf16, interleaved too
    ) -> torch.Tensor:  # [rows, w] bf16: round(round(silu(gate)) * up)
        if width % GATE_UP_GROUP:
            raise ValueError(f"the fused SiLU takes widths that are multiples of 32, got {width}")
        return self._run(self._silu, x, packed, 2 * width, width, bias)

    def _run(
        self,
        entry: Any,
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        out_width: int,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
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
        y = torch.empty(rows, out_width, dtype=torch.bfloat16)
        if rows == 0:
            return y
        entry(
            x.data_ptr(),
            rows,
            x.stride(0),
            k,
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            n,
            y.data_ptr(),
            out_width,
            torch.get_num_threads(),
        )
        return y


@functools.cache
def native_matmul() -> NativeMatmul:
    """The kernel, built on first call. Raises kernels.cpu_native.NativeBuildError where it
    cannot be built; not cached then."""
    return NativeMatmul(build(source=SOURCE, extra_flags=EXTRA_FLAGS))
