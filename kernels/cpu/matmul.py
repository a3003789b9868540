"""Matmuls by the hand-written kernel (kernels/cpu/native/matmul.cpp): y = x W^T + b over a weight
packed once into the kernel's layout, for any number of rows. bfloat16 by AVX512-BF16 (and AMX
where the CPU has it; AMX's layout for input widths that are a multiple of 32: `tiled`), or on
CPUs with AVX2 + FMA alone by float32 FMAs over the bf16 weights widened as they are read
(`tiled` too); float32 by the same FMA path (`f32_available`).
engine/step/packed_linear.py uses it beside or instead of oneDNN's packed weight where a start-up
timing says it pays (engine/step/native_matmul.py); the .cpp file says why and what it computes.

OpenMP: as for kernels/cpu/rows.py's kernel, the library's threads are PyTorch's and it is
told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from kernels.cpu import huge_pages
from kernels.cpu.native.build import build

SOURCE = Path(__file__).parent / "native" / "matmul.cpp"
# The fused SiLU rounds as kernels/cpu/native/layer.cpp's silu_mul, built the same way.
EXTRA_FLAGS = ("-ffp-contract=off",)
COLS = 64  # outputs per packed block
TILE_COLS = 16  # outputs per column tile of the AMX layout
GATE_UP_GROUP = COLS // 2  # gate outputs (and as many up outputs) in one block of the fused form
_P, _I = ctypes.c_void_p, ctypes.c_int64


def packed_size(n: int, k: int) -> int:
    """Values in the packed form of an [n, k] weight: outputs padded to blocks of 64."""
    return -(-n // COLS) * COLS * k


def unpack(packed: torch.Tensor, n: int, k: int, *, tiled: bool = False) -> torch.Tensor:
    """The plain [n, k] weight back from the kernel's layout: bf16 [n / 64][k / 2][64][2], or
    `tiled` [n / 64][4][k / 2][16][2]; float32 [n / 64][4][k][16]."""
    blocks = -(-n // COLS)
    group = 1 if packed.dtype is torch.float32 else 2
    tile = TILE_COLS if tiled or group == 1 else COLS
    view = packed.view(blocks, COLS // tile, k // group, tile, group)
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
        # bf16: AVX512-BF16 (AMX), or AVX2 + FMA; float32: AVX2 + FMA
        self.available = bool(lib.matmul_available())
        self.f32_available = bool(lib.matmul_f32_available())
        self._pack = {torch.bfloat16: lib.matmul_pack_bf16, torch.float32: lib.matmul_pack_f32}
        self._matmul = {torch.bfloat16: lib.matmul_bf16, torch.float32: lib.matmul_f32}
        self._silu = {torch.bfloat16: lib.matmul_silu_bf16, torch.float32: lib.matmul_silu_f32}
        for entry in self._pack.values():
            entry.argtypes, entry.restype = [_P, _I, _I, _P], None
        for entry in (*self._matmul.values(), *self._silu.values()):
            entry.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _I, ctypes.c_int]
            entry.restype = None
        self._tiled = lib.matmul_tiled
        self._tiled.argtypes = [_I]
        self._tiled.restype = ctypes.c_int
        # whether steps run on AMX's tiles (weights whose input width is a multiple of 32)
        self.amx = self.available and bool(lib.matmul_amx())
        self.library = library

    def tiled(self, k: int) -> bool:
        """Whether a bf16 weight of `k` inputs is packed as column tiles (see `unpack`)."""
        return bool(self._tiled(k))

    def unpack(self, packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """The plain [n, k] weight back from `pack`'s copy."""
        return unpack(packed, n, k, tiled=self.tiled(k))

    def takes(self, dtype: torch.dtype) -> bool:
        """Whether this CPU's build multiplies in `dtype`."""
        return (dtype is torch.bfloat16 and self.available) or (
            dtype is torch.float32 and self.f32_available
        )

    def packs(self, weight: torch.Tensor) -> bool:
        """Whether `pack` takes this weight: bf16 or float32 [n, k] on the CPU, k even, and the
        CPU has the instructions for that dtype."""
        return (
            self.takes(weight.dtype)
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and weight.shape[1] % 2 == 0
        )

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[n, k] -> the kernel's layout, `packed_size(n, k)` values of the weight's dtype
        (outputs past n zero)."""
        if not self.packs(weight):
            raise ValueError(
                f"the matmul kernel packs bf16 or float32 [n, even k] CPU weights where the CPU "
                f"has the instructions, got {weight.dtype} {tuple(weight.shape)} on "
                f"{weight.device.type} (bf16: {self.available}, float32: {self.f32_available})"
            )
        n, k = weight.shape
        plain = weight.detach().contiguous()
        # huge pages: at a few rows the kernel streams every weight, and the CPU's prefetchers
        # stop at page boundaries
        packed = huge_pages.empty((packed_size(n, k),), weight.dtype)
        self._pack[weight.dtype](plain.data_ptr(), n, k, packed.data_ptr())
        return packed

    def __call__(
        self,
        x: torch.Tensor,  # [rows, k] bf16 or float32, unit stride within a row
        packed: torch.Tensor,  # from `pack` of an [n, k] weight of x's dtype
        n: int,
        bias: torch.Tensor | None = None,  # [n] of x's dtype, contiguous
    ) -> torch.Tensor:  # [rows, n] of x's dtype
        return self._run(self._matmul, x, packed, n, n, bias)

    def silu(
        self,
        x: torch.Tensor,  # [rows, k] bf16 or float32
        packed: torch.Tensor,  # from `pack` of an interleaved (interleave_gate_up) [2 w, k] weight
        width: int,  # w, a multiple of 32
        bias: torch.Tensor | None = None,  # [2 w] of x's dtype, interleaved too
    ) -> torch.Tensor:  # [rows, w]: round(round(silu(gate)) * up) (no roundings in float32)
        if width % GATE_UP_GROUP:
            raise ValueError(f"the fused SiLU takes widths that are multiples of 32, got {width}")
        return self._run(self._silu, x, packed, 2 * width, width, bias)

    def _run(
        self,
        entries: dict[torch.dtype, Any],
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        out_width: int,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        if x.dim() != 2 or not self.takes(x.dtype):
            raise ValueError(
                f"the matmul kernel takes [rows, k] bf16 or float32 where this CPU multiplies "
                f"in it, got {x.dtype} {tuple(x.shape)}"
            )
        dtype = x.dtype
        if packed.dtype is not dtype:
            raise ValueError(f"packed weight is {packed.dtype}, x is {dtype}")
        rows, k = x.shape
        if x.stride(1) != 1 or x.stride(0) < k:
            x = x.contiguous()
        if packed.numel() != packed_size(n, k):
            raise ValueError(f"packed weight of {packed.numel()} values is not [{n}, {k}]")
        if bias is not None and not (bias.is_contiguous() and bias.shape == (n,)):
            raise ValueError(f"bias must be contiguous [{n}]")
        if bias is not None and bias.dtype is not dtype:
            raise ValueError(f"bias must be {dtype}, got {bias.dtype}")
        y = torch.empty(rows, out_width, dtype=dtype)
        if rows == 0:
            return y
        entries[dtype](
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
    """The kernel, built on first call. Raises kernels.cpu.native.build.NativeBuildError where it
    cannot be built; not cached then."""
    return NativeMatmul(build(source=SOURCE, extra_flags=EXTRA_FLAGS))
