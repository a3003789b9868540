"""How the CPU path groups a batch: long runs of one slot get a matmul pair each; short runs
next to each other (decode rows, a few sequences per adapter) share one masked pair.

A bf16 matmul on CPU costs ~20-40 us however few its rows are, so a decode batch of 64
sequences over 8 adapters paid 8 small pairs per projection. A dense block multiplies its rows
by every slot in the block's slot range at once and zeroes, per token, the columns of the slots
it does not use:

    y = x[rows] @ A[lo:hi].reshape(-1, in).T        [rows, (hi - lo) * R]
    y.view(rows, hi - lo, R)[off] = 0               off: token t does not use slot lo + j
    out[rows] += y @ B[lo:hi] as [(hi - lo) * R, out]

Exact (the zeroed products add nothing) if every stack entry in the slot range is finite and
zero beyond each slot's rank, which lora/layers.py guarantees (slots are zeroed before a
write; the loader rejects weights outside the float16 range). Its FLOPs grow with rows x slot
range, so only runs of up to DENSE_RUN_MAX rows, at most that many base-model rows apart, join
a block, and only while that product stays under DENSE_ROW_SLOTS_PER_RUN per run it replaces.
Measured on a 2-core AMD EPYC, bf16, 8 slots, qkv 768 -> 2304 at fused rank 48: 8 rows 173 us
dense vs 526 us per run, 64 rows 499 vs 538, 128 rows 931 vs 526.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

DENSE_RUN_MAX = 16
# A block's cost grows with rows x slot range, a run's is mostly the call: a block replaces its
# runs while rows x slot range <= this many per run (8 slots: 8 rows per run; 32 slots: 2).
DENSE_ROW_SLOTS_PER_RUN = 64


@dataclass(frozen=True, eq=False)
class DenseBlock:
    start: int  # rows [start, end) of the batch, base-model rows inside included
    end: int
    lo: int  # slots [lo, hi) are multiplied
    hi: int
    off: torch.Tensor  # [end - start, hi - lo, 1] bool: True where the token does not use the slot


@dataclass(frozen=True, eq=False)
class CpuPlan:
    runs: tuple[tuple[int, int, int], ...]  # (start, end, slot): a matmul pair each
    blocks: tuple[DenseBlock, ...]


def plan_cpu(
    segments: Sequence[tuple[int, int, int]], token_slots: Sequence[int], device: torch.device
) -> CpuPlan:
    """`segments`: (start, end, slot >= 0) runs in row order; `token_slots`: each row's slot."""
    runs: list[tuple[int, int, int]] = []
    blocks: list[DenseBlock] = []
    pending: list[tuple[int, int, int]] = []

    def flush() -> None:
        if len(pending) > 1 and _dense_pays(pending):
            blocks.append(_dense_block(pending, token_slots, device))
        else:
            runs.extend(pending)
        pending.clear()

    for segment in segments:
        start, end, _ = segment
        if pending and start - pending[-1][1] > DENSE_RUN_MAX:
            flush()  # a long stretch of base-model rows would be multiplied for nothing
        if end - start > DENSE_RUN_MAX:
            flush()
            runs.append(segment)
        else:
            pending.append(segment)
    flush()
    return CpuPlan(tuple(runs), tuple(blocks))


def _dense_pays(segments: Sequence[tuple[int, int, int]]) -> bool:
    rows = segments[-1][1] - segments[0][0]
    slot_range = max(slot for *_, slot in segments) - min(slot for *_, slot in segments) + 1
    return rows * slot_range <= DENSE_ROW_SLOTS_PER_RUN * len(segments)


def _dense_block(
    segments: Sequence[tuple[int, int, int]], token_slots: Sequence[int], device: torch.device
) -> DenseBlock:
    start, end = segments[0][0], segments[-1][1]
    lo = min(slot for _, _, slot in segments)
    hi = max(slot for _, _, slot in segments) + 1
    rows = torch.tensor(token_slots[start:end], dtype=torch.long, device=device)  # [rows]
    slots = torch.arange(lo, hi, device=device)  # [hi - lo]
    off = (rows[:, None] != slots[None, :]).unsqueeze(-1)  # [rows, hi - lo, 1]
    return DenseBlock(start, end, lo, hi, off)
