"""Adapters for the LoRA benchmark: PEFT directories with seeded random weights (made by
lora/make_adapter.py, what `loragate make-adapter` writes), cached on disk between runs, and
zipf popularity over registered names."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

from lora.make_adapter import AdapterRecipe, make_adapter


def make_adapters(model_dir: Path, out_dir: Path, *, count: int, rank: int) -> list[Path]:
    """`count` rank-`rank` all-linear adapters (alpha = 2 x rank), made once and reused."""
    paths = [out_dir / f"r{rank}-{i}" for i in range(count)]
    for i, path in enumerate(paths):
        if not (path / "adapter_model.safetensors").exists():
            make_adapter(model_dir, path, AdapterRecipe(rank=rank, seed=1000 + i))
    return paths


def round_robin(num_requests: int, names: Sequence[str]) -> list[str]:
    return [names[i % len(names)] for i in range(num_requests)]


def zipf_assign(num_requests: int, names: Sequence[str], *, s: float, seed: int) -> list[str]:
    """Each request's adapter, drawn with probability proportional to 1 / rank**s."""
    weights = [1.0 / (i + 1) ** s for i in range(len(names))]
    return random.Random(seed).choices(list(names), weights=weights, k=num_requests)


def decode_step_bound(
    output_lens: Sequence[int],
    assignment: Sequence[str | None],
    *,
    max_loras: int,
    max_num_seqs: int,
) -> int:
    """Fewest decode steps any scheduler needs, prefill aside: a step gives a sequence at most
    one token and holds at most `max_num_seqs` sequences, and an adapter keeps one of the
    `max_loras` slots for at least as many steps as its longest request decodes."""
    longest: dict[str, int] = {}
    for length, adapter in zip(output_lens, assignment, strict=True):
        if adapter is not None:
            longest[adapter] = max(longest.get(adapter, 0), length)
    return max(
        max(output_lens, default=0),
        math.ceil(sum(output_lens) / max_num_seqs),
        math.ceil(sum(longest.values()) / max_loras),
    )
