"""Adapters for the LoRA benchmark: real PEFT directories (saved by PEFT itself) with seeded
random weights, cached on disk between runs, and zipf popularity over registered names."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def make_adapters(model_dir: Path, out_dir: Path, *, count: int, rank: int) -> list[Path]:
    """`count` rank-`rank` all-linear adapters (alpha = 2 x rank), made once and reused."""
    paths = [out_dir / f"r{rank}-{i}" for i in range(count)]
    missing = [p for p in paths if not (p / "adapter_model.safetensors").exists()]
    if not missing:
        return paths
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(base, config)
        for path in missing:
            _randomize(model, seed=int(path.name.rsplit("-", 1)[1]))
            model.save_pretrained(str(path))
    return paths


def _randomize(model: Any, *, seed: int) -> None:
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".lora_A." in name:
                bound = 1.0 / param.shape[1] ** 0.5
                param.copy_((torch.rand(param.shape, generator=gen) * 2 - 1) * bound)
            elif ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.01)


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
