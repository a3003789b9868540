"""How the CPU path groups a batch: a long run of one slot gets a matmul pair; the rows of the
short runs (decode rows, a few sequences per adapter) go to one gathered kernel call together.

A bf16 matmul on CPU costs ~20-40 us however few its rows are, so a run of a few rows is not
worth a matmul pair of its own: a decode batch of 64 sequences over 8 adapters would pay 8 pairs
per projection, over 50 adapters 50. The gathered kernel (kernels/cpu/rows.py) takes every
short-run row in one call, each row multiplied by its own slot's weights. Runs longer than
DENSE_RUN_MAX rows (prefill chunks, popular adapters) stay matmul pairs, where BLAS reads each
weight once for all the run's rows.

Measured on a 2-core AMD EPYC, bf16, the four projections of 12 layers of the small model, 64
slots, 34 decode rows, one step: 17 adapters spread over the slots 7.3 ms gathered against
36.6 ms for the padded `bmm` over the slot range that came before; 8 adapters 4.8 against 6.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

DENSE_RUN_MAX = 16


@dataclass(frozen=True, eq=False)
class GatheredRows:
    rows: torch.Tensor  # [T] long: the batch rows of the short runs, T >= 2
    slots: torch.Tensor  # [T] long: each row's slot


@dataclass(frozen=True, eq=False)
class CpuPlan:
    runs: tuple[tuple[int, int, int], ...]  # (start, end, slot): a matmul pair each
    gathered: GatheredRows | None
    # every non-empty run, long and short, [K, 3] int64 (start, end, slot): what the tiled
    # kernel takes in one call where it runs (kernels/cpu/native/lora_runs.h; bf16 on AVX512-BF16 or AVX2 + FMA)
    segments: torch.Tensor


def plan_cpu(
    segments: Sequence[tuple[int, int, int]], ranks: Sequence[int], device: torch.device
) -> CpuPlan:
    """`segments`: (start, end, slot >= 0) runs in row order; `ranks[slot]` = 0 for an empty
    slot, whose rows get nothing."""
    segments = [segment for segment in segments if ranks[segment[2]]]
    every = torch.tensor(segments, dtype=torch.long, device=device).reshape(-1, 3)
    short = [s for s in segments if s[1] - s[0] <= DENSE_RUN_MAX]
    if len(short) < 2:  # a lone short run is just a run
        return CpuPlan(tuple(segments), None, every)
    rows = [row for start, end, _ in short for row in range(start, end)]
    slots = [slot for start, end, slot in short for _ in range(start, end)]

    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    runs = tuple(s for s in segments if s[1] - s[0] > DENSE_RUN_MAX)
    return CpuPlan(runs, GatheredRows(as_tensor(rows), as_tensor(slots)), every)
