"""Token bitmasks of grammar-constrained decoding on the CPU (kernels/cpu/native/token_mask.cpp).

`TokenMask.mask_rows` and `TokenMask.masked_argmax` compute what their PyTorch references below
compute (`mask_rows_reference`, `masked_argmax_reference`), for CPU logits with unit stride in a
row (masking: float32; argmax: bfloat16 or float32). engine/structured/masks.py calls them and
falls back to the references where the library cannot be built.

OpenMP: as for kernels/cpu/rows.py's kernel, the library's threads are PyTorch's; each call is
told `torch.get_num_threads()` and spreads rows only when there are enough of them.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kernels.cpu.native.build import build

SOURCE = Path(__file__).parent / "native" / "token_mask.cpp"
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGMAX_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}


def allowed_reference(bitmask: torch.Tensor, cols: int) -> torch.Tensor:
    """`allowed[r, c] = bool(bitmask[r, c // 32] >> (c % 32) & 1)`: [rows, cols] bool."""
    bits = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)
    allowed = (bitmask.unsqueeze(-1) & bits.to(bitmask.device)) != 0  # [rows, words, 32]
    return allowed.view(bitmask.shape[0], -1)[:, :cols]


def mask_rows_reference(x: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    if not rows:
        return
    index = torch.tensor(list(rows), dtype=torch.long, device=x.device)
    allowed = allowed_reference(bitmask[index], x.shape[1])
    x[index] = x[index].masked_fill(~allowed, float("-inf"))


def masked_argmax_reference(x: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    allowed = allowed_reference(bitmask, x.shape[1])
    masked = x.float().masked_fill(~allowed, float("-inf"))
    best = masked.argmax(dim=-1)  # [rows]
    # where every allowed value is -inf, the first allowed column (argmax alone would answer
    # 0, allowed or not); where nothing is allowed, 0: as the kernel does
    no_finite = masked.amax(dim=-1) == float("-inf")
    return torch.where(no_finite, allowed.int().argmax(dim=-1), best)


def _check(x: torch.Tensor, bitmask: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or x.device.type != "cpu":
        raise ValueError("x must be [rows, cols] CPU logits with unit stride in a row")
    words = (x.shape[1] + 31) // 32
    if bitmask.dtype != torch.int32 or not bitmask.is_contiguous():
        raise ValueError("bitmask must be contiguous int32")
    if bitmask.shape != (x.shape[0], words):
        raise ValueError(f"bitmask must be [{x.shape[0]}, {words}], got {tuple(bitmask.shape)}")


class TokenMask:
    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        self._mask_rows = lib.mask_rows_f32
        self._mask_rows.argtypes = [_P, _I, _P, _I, _P, _I, _I, _I]
        self._mask_rows.restype = None
        self._argmax: dict[torch.dtype, Any] = {}
        for dtype, suffix in _ARGMAX_SUFFIX.items():
            entry = getattr(lib, f"masked_argmax_{suffix}")
            entry.argtypes = [_P, _I, _P, _I, _I, _I, _P, _I]
            entry.restype = None
            self._argmax[dtype] = entry

    def mask_rows(self, x: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """x: [rows, cols] float32 logits, edited in place; bitmask: [rows, ceil(cols / 32)]
        int32; rows: which rows to mask (the others are left alone)."""
        _check(x, bitmask)
        if x.dtype != torch.float32:
            raise ValueError(f"mask_rows needs float32 logits x, got {x.dtype}")
        index = torch.tensor(list(rows), dtype=torch.int64)
        if len(index) and not (int(index.min()) >= 0 and int(index.max()) < x.shape[0]):
            raise ValueError("rows must index x's rows")
        self._mask_rows(
            x.data_ptr(),
            x.stride(0),
            index.data_ptr(),
            len(index),
            bitmask.data_ptr(),
            bitmask.shape[1],
            x.shape[1],
            torch.get_num_threads(),
        )

    def masked_argmax(self, x: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """Each row's argmax over the columns its bitmask allows: [rows] int64."""
        _check(x, bitmask)
        entry = self._argmax.get(x.dtype)
        if entry is None:
            raise ValueError(f"masked_argmax takes bfloat16 or float32 logits x, got {x.dtype}")
        out = torch.empty(x.shape[0], dtype=torch.int64)
        entry(
            x.data_ptr(),
            x.stride(0),
            bitmask.data_ptr(),
            bitmask.shape[1],
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return out


@functools.cache
def token_mask() -> TokenMask:
    """The kernels, built on first call. Raises kernels.cpu.native.build.NativeBuildError where they
    cannot be built; not cached then."""
    return TokenMask(build(source=SOURCE))
