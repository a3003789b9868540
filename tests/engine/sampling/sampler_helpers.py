"""What the sampler tests share (CPU, no model): a batch row built from sampling params, logits
from probabilities, many seeded draws and their frequencies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from engine.sampling.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams

CPU = torch.device("cpu")
VOCAB = 32


def make_row(
    params: SamplingParams | None = None,
    *,
    seed: int | None = None,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    banned: Sequence[int] = (),
) -> SamplingRow:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return SamplingRow(
        params=params or SamplingParams(),
        generator=generator,
        prompt_token_ids=prompt,
        output_token_ids=output,
        banned_token_ids=banned,
    )


def logits_from_probs(probs: Sequence[float], vocab: int = VOCAB) -> torch.Tensor:
    """[vocab] logits whose softmax puts probs on ids 0.. and nothing elsewhere."""
    logits = torch.full((vocab,), float("-inf"))
    logits[: len(probs)] = torch.tensor(probs).log()
    return logits


def sample_many(
    logits_row: torch.Tensor, params: SamplingParams, num: int = 4000, seed: int = 0
) -> Counter[int]:
    """num independent draws: num identical rows in one batch from a seeded sampler."""
    sampler = Sampler(logits_row.shape[0], CPU, seed=seed)
    logits = logits_row.expand(num, -1).contiguous()  # [num, vocab]
    tokens = sampler.sample(logits, [make_row(params)] * num)
    return Counter(t.token_id for t in tokens)


def frequencies(counts: Counter[int]) -> dict[int, float]:
    total = sum(counts.values())
    return {token: n / total for token, n in counts.items()}


def assert_frequencies(counts: Counter[int], expected: dict[int, float], tol: float = 0.04) -> None:
    assert set(counts) == {t for t, p in expected.items() if p > 0}
    got = frequencies(counts)
    for token, p in expected.items():
        assert abs(got.get(token, 0.0) - p) < tol, (token, got, expected)
