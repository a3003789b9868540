"""Pick the decode attention backend once, at start-up, by timing both on this machine.

Neither CPU path wins everywhere: on an AMX Xeon SDPA's flash kernel was ~3x faster than
matmul + softmax for decode, on an AVX512-BF16 AMD EPYC (no AMX) it was ~6x slower in bf16.
Both compute the same attention (float32 softmax; outputs agree to float32 rounding in float32,
to a bf16 ulp in bf16), so the choice changes speed, not results beyond rounding. On CUDA the
fused kernel is used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from engine.attention import DecodeBackend, decode_matmul, decode_sdpa

log = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("auto", "matmul", "sdpa")

# The timed problem: a mid-sized decode group (rows x context keys), a few repeats, best of.
_ROWS, _CONTEXT, _REPEATS = 16, 256, 5


def choose_decode_backend(
    requested: str,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> DecodeBackend:
    if requested == "matmul":
        return "matmul"
    if requested == "sdpa":
        return "sdpa"
    if requested != "auto":
        raise ValueError(f"decode_attention must be one of {BACKENDS}, got {requested!r}")
    if device.type != "cpu":
        return "sdpa"
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(_ROWS, num_heads, head_dim, generator=gen).to(dtype)
    keys = torch.randn(num_kv_heads, _ROWS, _CONTEXT, head_dim, generator=gen).to(dtype)
    values = torch.randn(num_kv_heads, _ROWS, _CONTEXT, head_dim, generator=gen).to(dtype)
    mask = torch.ones(_ROWS, _CONTEXT, dtype=torch.bool)
    mask[::2, _CONTEXT // 2 :] = False  # padded rows, as in a real group
    scale = head_dim**-0.5
    timings = {
        name: _best_time(attend, (query, keys, values, mask), scale)
        for name, attend in (("matmul", decode_matmul), ("sdpa", decode_sdpa))
    }
    chosen: DecodeBackend = "matmul" if timings["matmul"] <= timings["sdpa"] else "sdpa"
    log.info(
        "decode attention: %s (matmul %.2f ms, sdpa %.2f ms for %d rows x %d keys, %s)",
        chosen, 1e3 * timings["matmul"], 1e3 * timings["sdpa"], _ROWS, _CONTEXT, dtype,
    )  # fmt: skip
    return chosen


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def _best_time(
    attend: Attend,
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    scale: float,
) -> float:
    attend(*tensors, scale)  # warm-up: first calls allocate and pick kernels
    best = float("inf")
    for _ in range(_REPEATS):
        start = time.perf_counter()
        attend(*tensors, scale)
        best = min(best, time.perf_counter() - start)
    return best
