"""Pick the decode attention backend once, at start-up, by timing each on this machine.

No CPU path wins everywhere: on an AMX Xeon SDPA's flash kernel was ~3x faster than matmul +
softmax for decode, on an AVX512-BF16 AMD EPYC (no AMX) it was ~6x slower in bf16, and there
the hand-written kernel that reads the paged cache in place ("native", kernels/cpu/native/attention.cpp)
was ~5x faster than gather + matmul. All compute the same attention (float32 softmax; outputs
agree to float32 rounding in float32, to a bf16 ulp in bf16), so the choice changes speed, not
results beyond rounding. Each is timed as a step runs it, from the paged cache (the gathers
included). On CUDA the fused kernel is used.
"""

from __future__ import annotations

import logging

import torch

from engine.step.attention import AttentionMetadata, DecodeBackend, decode_attention
from engine.step.timing import best_time
from kernels.cpu.attention import native_paged_decode
from kernels.cpu.native.build import built_or_none

log = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("auto", "matmul", "sdpa", "native")

# The timed problem: a mid-sized decode batch (rows x context keys, half the rows at half the
# context, blocks in shuffled order as a busy cache holds them), a few repeats, best of.
_ROWS, _CONTEXT, _BLOCK_SIZE, _REPEATS = 16, 256, 16, 5


def native_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the native kernel serves this dtype and device, building it if needed."""
    kernel = built_or_none(native_paged_decode, "native decode attention unavailable; gathering")
    return kernel is not None and kernel.supports(dtype, device)


def choose_decode_backend(
    requested: str,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> DecodeBackend:
    if requested not in BACKENDS:
        raise ValueError(f"decode_attention must be one of {BACKENDS}, got {requested!r}")
    if requested == "native":
        if not native_available(dtype, device):
            raise ValueError(f"decode_attention 'native' needs a CPU and bf16 or fp32, got "
                             f"{dtype} on {device.type}")  # fmt: skip
        return "native"
    if requested in ("matmul", "sdpa"):
        return requested  # type: ignore[return-value]
    if device.type != "cpu":
        return "sdpa"
    candidates: list[DecodeBackend] = ["matmul", "sdpa"]
    if native_available(dtype, device):
        candidates.insert(0, "native")
    problem = _problem(num_heads, num_kv_heads, head_dim, dtype)
    timings = {name: _best_time(name, *problem) for name in candidates}
    chosen = min(timings, key=timings.__getitem__)
    log.info(
        "decode attention: %s (%s for %d rows x %d keys, %s)",
        chosen, ", ".join(f"{name} {1e3 * t:.2f} ms" for name, t in timings.items()),
        _ROWS, _CONTEXT, dtype,
    )  # fmt: skip
    return chosen


Problem = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]


def _problem(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> Problem:
    gen = torch.Generator().manual_seed(0)
    blocks_per_row = _CONTEXT // _BLOCK_SIZE
    num_slots = _ROWS * _CONTEXT
    query = torch.randn(_ROWS, num_heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_kv_heads, num_slots, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_kv_heads, num_slots, head_dim, generator=gen).to(dtype)
    order = torch.randperm(_ROWS * blocks_per_row, generator=gen)
    tables = order.view(_ROWS, blocks_per_row).contiguous()
    lengths = [_CONTEXT if row % 2 else _CONTEXT // 2 for row in range(_ROWS)]
    return query, k_cache, v_cache, tables, lengths


def _best_time(
    backend: DecodeBackend,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lengths: list[int],
) -> float:
    def run() -> None:
        meta = AttentionMetadata(
            slot_mapping=torch.empty(0, dtype=torch.long),
            num_decodes=_ROWS,
            block_size=_BLOCK_SIZE,
            decode_tables=tables,
            decode_lengths=lengths,
            prefills=[],
            decode_backend=backend,
        )
        decode_attention(query, k_cache, v_cache, meta, query.shape[-1] ** -0.5)

    return best_time(run, _REPEATS)
