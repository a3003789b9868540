"""Whether decode steps of 1-2 rows multiply by the hand-written kernel (kernels/cpu_gemv.py),
decided once at start-up for the model's packed linears.

At a few rows a step's matmuls only stream their weights, and oneDNN's call costs ~15-20 us
before it streams: on a 2-core AVX512-BF16 EPYC whose copy ran at 31 GB/s, the small model's
49 matmuls at one row took 9.5 ms through oneDNN and 7.7 ms through the kernel (the step itself
~10.8). The kernel reads its own copy of each weight (oneDNN's packed form is opaque), so the
weights' memory doubles: "auto" takes it only where a timing of the model's own matmuls at one
row finds the kernel clearly faster and the copy fits in a quarter of the memory free at the
time. CUDA, float32 and CPUs without AVX512-BF16 keep oneDNN.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import nn

from engine.packed_linear import PackedLinear
from engine.timing import best_time
from kernels.cpu_gemv import NativeGemv, native_gemv
from kernels.cpu_native import NativeBuildError

log = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("auto", "on", "off")
# The kernel must be faster by more than the timing's noise: a tie is not worth the memory.
# (Timed alone the gain reads smaller than in a step: on the EPYC above the 49 matmuls timed
# 1.02-1.16x faster back to back, 1.10-1.22x inside the engine's steps.)
_MIN_GAIN = 1.03
_REPEATS = 7
# The copy may take at most this share of the memory free when the engine starts.
_MEMORY_SHARE = 0.25


def use_decode_gemv(model: nn.Module, requested: str, dtype: torch.dtype) -> tuple[bool, str]:
    """Install the kernel on every packed linear of `model` where `requested` (auto, on, off)
    and this machine say so; returns whether it did, and why (for the start-up log)."""
    if requested not in MODES:
        raise ValueError(f"decode_gemv must be one of {MODES}, got {requested!r}")
    if requested == "off":
        return False, "off"
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    # The model's side first: a float32 or CUDA engine never builds the kernel's library.
    reason = _unusable(linears, dtype)
    gemv = _kernel() if reason is None else None
    if reason is None and (gemv is None or not gemv.available):
        reason = "the CPU has no AVX512-BF16 (or no C++ compiler)"
    if reason is not None:
        if requested == "on":
            raise ValueError(f"decode_gemv 'on': {reason}")
        return False, reason
    assert gemv is not None
    extra = sum(m.in_features * m.out_features * 2 for m in linears)
    free = _free_memory()
    if requested == "auto" and free is not None and extra > _MEMORY_SHARE * free:
        return False, f"the copy ({extra / 2**20:.0f} MiB) exceeds a quarter of free memory"
    for m in linears:
        m.use_gemv(gemv)
    if requested == "on":
        return True, "on"
    onednn_s, gemv_s = _time_one_row(linears, gemv)
    figures = f"one row: oneDNN {onednn_s * 1e3:.2f} ms, kernel {gemv_s * 1e3:.2f} ms"
    if onednn_s < _MIN_GAIN * gemv_s:
        for m in linears:
            m.use_gemv(None)
        return False, figures
    return True, figures


def _kernel() -> NativeGemv | None:
    try:
        return native_gemv()
    except NativeBuildError as exc:
        log.warning("decode gemv kernel unavailable (%s)", exc)
        return None


def _unusable(linears: list[PackedLinear], dtype: torch.dtype) -> str | None:
    if dtype is not torch.bfloat16:
        return f"the kernel is bf16 only, the model runs {dtype}"
    if not linears:
        return "no packed linear layers"
    if any(m.in_features % 2 for m in linears):
        return "a linear layer has an odd input width"
    return None


def _free_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def matmul_steps(
    linears: list[PackedLinear], rows: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Every linear once at `rows` rows, as a decode step runs them (each weight from memory):
    one run through oneDNN, one through the kernel (installed on each by `use_gemv`)."""
    inputs = {m.in_features: torch.randn(rows, m.in_features).to(torch.bfloat16) for m in linears}

    def onednn() -> None:
        for m in linears:
            torch.ops.mkldnn._linear_pointwise(
                inputs[m.in_features], m.packed_weight, m.bias, "none", [], ""
            )

    def kernel() -> None:
        for m in linears:
            assert m.gemv is not None
            gemv, packed = m.gemv
            gemv(inputs[m.in_features], packed, m.out_features, m.bias)

    return onednn, kernel


def _time_one_row(linears: list[PackedLinear], gemv: NativeGemv) -> tuple[float, float]:
    """`matmul_steps` at one row, oneDNN's and the kernel's: best of a few."""
    onednn, kernel = matmul_steps(linears, rows=1)
    onednn_s = gemv_s = float("inf")
    for _ in range(_REPEATS):  # interleaved, so a busy moment of the machine hits both
        onednn_s = min(onednn_s, best_time(onednn, 1))
        gemv_s = min(gemv_s, best_time(kernel, 1))
    return onednn_s, gemv_s
