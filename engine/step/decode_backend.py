"""Pick the decode attention backend by timing each on this machine: once, at the first start
with a tuning file, whose choice every later start reads (engine/step/choices/tuning.py).

No CPU path wins everywhere: on an AMX Xeon SDPA's flash kernel was ~3x faster than matmul +
softmax for decode, on an AVX512-BF16 AMD EPYC (no AMX) it was ~6x slower in bf16, and there
the hand-written kernel that reads the paged cache in place ("native", kernels/cpu/native/attention.cpp)
was ~5x faster than gather + matmul. All compute the same attention (float32 softmax; outputs
agree to float32 rounding in float32, to a bf16 ulp in bf16), so the choice changes speed, not
results beyond rounding. Each is timed as a step runs it, from the paged cache (the gathers
included). On CUDA the fused kernel is used.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine.step.attention import AttentionMetadata, DecodeBackend, decode_attention
from engine.step.choices.choice import DECODE_ATTENTION
from engine.step.choices.startup import StartupChoices
from engine.step.choices.timing import best_times
from kernels.cpu.attention import native_paged_decode
from kernels.cpu.native.build import built_or_none

log = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("auto", "matmul", "sdpa", "native")

# The timed problem: a mid-sized decode batch (rows x context keys, half the rows at half the
# context, blocks in shuffled order as a busy cache holds them), best of many interleaved
# repeats.
_ROWS, _CONTEXT, _BLOCK_SIZE, _REPEATS = 16, 256, 16, 15


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
    choices: StartupChoices | None = None,
) -> DecodeBackend:
    """`requested` "auto": the backend saved in the tuning file for this machine and model, or
    the fastest timed now (engine/step/choices/startup.py; `choices` None: timed, not saved)."""
    if requested not in BACKENDS:
        raise ValueError(f"decode_attention must be one of {BACKENDS}, got {requested!r}")
    choices = choices or StartupChoices()
    if requested == "native" and not native_available(dtype, device):
        raise ValueError(f"decode_attention 'native' needs a CPU and bf16 or fp32, got "
                         f"{dtype} on {device.type}")  # fmt: skip
    if requested != "auto":
        choice = choices.pin(DECODE_ATTENTION, requested, f"decode_attention {requested}")
    elif device.type != "cpu":
        choice = choices.fix(DECODE_ATTENTION, "sdpa", f"on {device.type}: the fused kernel")
    else:
        candidates: list[DecodeBackend] = ["matmul", "sdpa"]
        if native_available(dtype, device):
            candidates.insert(0, "native")
        timed = functools.partial(_fastest, candidates, num_heads, num_kv_heads, head_dim, dtype)
        choice = choices.decide(DECODE_ATTENTION, candidates, timed)
    log.info("decode attention: %s (%s)", choice.value, choice.origin())
    return choice.value  # type: ignore[return-value]


def _fastest(
    candidates: list[DecodeBackend],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> tuple[str, str]:
    """The fastest of `candidates` on the timed problem, and the figures."""
    problem = _problem(num_heads, num_kv_heads, head_dim, dtype)
    timings = best_times({name: _step(name, *problem) for name in candidates}, _REPEATS)
    figures = ", ".join(f"{name} {1e3 * t:.2f} ms" for name, t in timings.items())
    return min(timings, key=timings.__getitem__), (
        f"{figures} for {_ROWS} rows x {_CONTEXT} keys, {dtype}"
    )


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


def _step(
    backend: DecodeBackend,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lengths: list[int],
) -> Callable[[], None]:
    """The timed problem's decode attention by `backend`, as a step runs it."""

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

    return run
