"""Shared LoRA kernel test cases: adapter mixes over slots with mixed ranks, NaN padding, a
float64 per-token oracle, and a strided output slice of a wider fused projection."""

from __future__ import annotations

import random

import torch

from kernels.triton.meta import LoRAForm, LoRAKernelMeta

IN_FEATURES = 96  # not a power of two: exercises the K masks
OUT_FEATURES = 80  # a slice of a wider fused output, also not a tile multiple
FUSED_WIDTH, OUT_OFFSET = 200, 30
MAX_RANK = 64
RANK_CYCLE = (8, 16, 32, 64)
FORMS: tuple[LoRAForm, ...] = ("segmented", "gathered")
MIXES = ("all_distinct", "all_same", "skewed", "zipf", "with_base", "prefill_runs")


def slot_mix(kind: str, num_tokens: int, rng: random.Random) -> tuple[list[int], int]:
    """(token_slots, num_slots) for one named adapter mix."""
    if kind == "all_distinct":
        return list(range(num_tokens)), num_tokens + 1  # one empty slot at the end
    num_slots = 9  # the last slot stays empty
    if kind == "all_same":
        return [3] * num_tokens, num_slots
    if kind == "skewed":
        return [
            0 if rng.random() < 0.8 else rng.randrange(1, 8) for _ in range(num_tokens)
        ], num_slots
    if kind == "zipf":
        weights = [1.0 / (k + 1) ** 1.2 for k in range(8)]
        return rng.choices(range(8), weights=weights, k=num_tokens), num_slots
    if kind == "with_base":
        return [
            rng.randrange(-1, 8) if rng.random() < 0.7 else -1 for _ in range(num_tokens)
        ], num_slots
    # prefill_runs: sequences of random lengths, each on one slot or on the base model.
    slots: list[int] = []
    while len(slots) < num_tokens:
        slots += [rng.randrange(-1, 8)] * rng.randint(1, 12)
    return slots[:num_tokens], num_slots


def make_case(
    kind: str, num_tokens: int, dtype: torch.dtype, seed: int = 0, padding: float = float("nan")
) -> tuple[LoRAKernelMeta, torch.Tensor, torch.Tensor, torch.Tensor]:
    """meta, x, lora_a, lora_b; ranks 8/16/32/64 mixed, the last slot empty, `padding` beyond
    each slot's rank (NaN: a read of padding shows in the output)."""
    rng = random.Random(f"{kind}-{num_tokens}-{seed}")
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    token_slots, num_slots = slot_mix(kind, num_tokens, rng)
    ranks = [RANK_CYCLE[s % len(RANK_CYCLE)] for s in range(num_slots - 1)] + [0]
    x = torch.randn(num_tokens, IN_FEATURES, generator=gen)  # [num_tokens, in_features]
    lora_a = torch.randn(num_slots, MAX_RANK, IN_FEATURES, generator=gen) * 0.3  # [S, R, in]
    lora_b = torch.randn(num_slots, OUT_FEATURES, MAX_RANK, generator=gen) * 0.3  # [S, out, R]
    for slot, rank in enumerate(ranks):
        lora_a[slot, rank:] = padding
        lora_b[slot, :, rank:] = padding
    meta = LoRAKernelMeta.build(token_slots, ranks, MAX_RANK, "cpu")
    return meta, x.to(dtype), lora_a.to(dtype), lora_b.to(dtype)


def fused_output(num_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(num_tokens)
    return torch.randn(num_tokens, FUSED_WIDTH, generator=gen).to(dtype)  # [T, fused width]


def out_slice(fused: torch.Tensor) -> torch.Tensor:
    return fused[:, OUT_OFFSET : OUT_OFFSET + OUT_FEATURES]  # [T, out_features], row-strided


def assert_untouched(before: torch.Tensor, after: torch.Tensor, meta: LoRAKernelMeta) -> None:
    """Columns outside the slice and rows of slot -1 keep their exact bits."""
    outside = torch.ones(FUSED_WIDTH, dtype=torch.bool)
    outside[OUT_OFFSET : OUT_OFFSET + OUT_FEATURES] = False
    assert torch.equal(after[:, outside], before[:, outside])
    base_rows = meta.token_slots < 0
    assert torch.equal(after[base_rows], before[base_rows])


def oracle(
    x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, meta: LoRAKernelMeta
) -> torch.Tensor:
    """Naive per-token float64 loop: delta[t] = x[t] @ A[s, :r].T @ B[s, :, :r].T."""
    delta = torch.zeros(meta.num_tokens, lora_b.shape[1], dtype=torch.float64)  # [T, out]
    for t, slot in enumerate(meta.token_slots.tolist()):
        rank = int(meta.slot_ranks[slot]) if slot >= 0 else 0
        if rank:
            a, b = lora_a[slot, :rank].double(), lora_b[slot, :, :rank].double()
            delta[t] = (x[t].double() @ a.T) @ b.T
    return delta
