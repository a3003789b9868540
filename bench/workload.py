"""The benchmark's requests: seeded prompt and output lengths, random prompt token ids.

Everything here is plain Python over a `random.Random(seed)`, so the same spec and token pool
give the same requests on every machine (the test in tests/bench checks it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    num_requests: int
    # Inclusive ranges; equal bounds give the equal-length case.
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    seed: int

    def __post_init__(self) -> None:
        for field, (low, high) in (
            ("prompt_len", self.prompt_len),
            ("output_len", self.output_len),
        ):
            if not 1 <= low <= high:
                raise ValueError(f"{field} must satisfy 1 <= low <= high, got {(low, high)}")
        if self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt_token_ids: tuple[int, ...]
    # Exactly this many tokens are generated (greedy, ignore_eos) and count as useful.
    num_output_tokens: int

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def make_workload(spec: WorkloadSpec, token_pool: Sequence[int]) -> list[BenchRequest]:
    """`spec.num_requests` requests with lengths uniform in the spec's ranges (inclusive)."""
    if not token_pool:
        raise ValueError("token_pool must not be empty")
    rng = random.Random(spec.seed)
    requests = []
    for index in range(spec.num_requests):
        # Lengths first, then ids, per request: changing the pool never changes the lengths.
        num_prompt = rng.randint(*spec.prompt_len)
        num_output = rng.randint(*spec.output_len)
        prompt = tuple(rng.choice(token_pool) for _ in range(num_prompt))
        requests.append(BenchRequest(index, prompt, num_output))
    return requests


def token_pool(model_dir: Path) -> list[int]:
    """The tokenizer's ordinary token ids: its real range (often far below the model's vocab
    size for the generated checkpoints) without the special tokens, so no prompt holds an EOS
    or a chat marker."""
    from transformers import AutoTokenizer  # slow import, kept out of the workload test

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def summarize(requests: Sequence[BenchRequest]) -> dict[str, int]:
    return {
        "num_requests": len(requests),
        "num_prompt_tokens": sum(r.num_prompt_tokens for r in requests),
        "num_output_tokens": sum(r.num_output_tokens for r in requests),
        "max_prompt_len": max(r.num_prompt_tokens for r in requests),
        "max_output_len": max(r.num_output_tokens for r in requests),
    }
