"""Sampler tests (CPU, no model): logit_bias, allowed_token_ids, banned ids, and the
repetition, frequency and presence penalties against a reference."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from engine.sampling.logits_processors import apply_penalties
from engine.sampling.sampler import Sampler
from engine.sampling_params import SamplingParams
from tests.engine.sampling.sampler_helpers import (
    CPU,
    VOCAB,
    logits_from_probs,
    make_row,
    sample_many,
)

# --- logit_bias, allowed_token_ids, banned ids --------------------------------------------


def test_logit_bias_forces_a_token() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4)).clamp(-1, 1)
    params = SamplingParams(logit_bias={17: 100.0})
    greedy = SamplingParams(temperature=0.0, logit_bias={17: 100.0})
    tokens = Sampler(VOCAB, CPU).sample(logits, [make_row(params), make_row(greedy)])
    assert [t.token_id for t in tokens] == [17, 17]
    assert set(sample_many(logits[0], params, num=500)) == {17}


def test_logit_bias_negative_removes_the_favourite() -> None:
    logits = logits_from_probs([0.9, 0.1])
    params = SamplingParams(temperature=0.0, logit_bias={0: -100.0})
    assert Sampler(VOCAB, CPU).sample(logits[None], [make_row(params)])[0].token_id == 1


def test_allowed_token_ids_restrict_support() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(6))
    allowed = (2, 9, 30)
    counts = sample_many(logits, SamplingParams(allowed_token_ids=allowed, temperature=3.0))
    assert set(counts) == set(allowed)
    greedy = SamplingParams(temperature=0.0, allowed_token_ids=allowed)
    best = max(allowed, key=lambda t: logits[t].item())
    assert Sampler(VOCAB, CPU).sample(logits[None], [make_row(greedy)])[0].token_id == best


def test_banned_ids_never_sampled() -> None:
    logits = logits_from_probs([0.6, 0.3, 0.1])
    sampler = Sampler(VOCAB, CPU)
    greedy = sampler.sample(logits[None], [make_row(SamplingParams(temperature=0.0), banned=[0])])
    assert greedy[0].token_id == 1
    rows = [make_row(banned=[0, 0])] * 2000  # duplicates are harmless
    counts = Counter(t.token_id for t in sampler.sample(logits.expand(2000, -1), rows))
    assert set(counts) == {1, 2}


def test_ban_that_would_empty_the_row_is_lifted() -> None:
    # allowed_token_ids holds only the banned id: the row keeps it rather than turning NaN.
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(7))
    rows = [
        make_row(SamplingParams(allowed_token_ids=(4,), top_p=0.5, min_p=0.1), banned=[4]),
        make_row(SamplingParams(temperature=0.0, allowed_token_ids=(4, 5)), banned=[4]),
    ]
    tokens = Sampler(VOCAB, CPU).sample(logits, rows)
    assert [t.token_id for t in tokens] == [4, 5]


# --- penalties -----------------------------------------------------------------------------


def reference_penalties(
    logits: torch.Tensor,
    prompt: Sequence[int],
    output: Sequence[int],
    repetition: float,
    frequency: float,
    presence: float,
) -> list[float]:
    out = []
    for token, value in enumerate(logits.tolist()):
        if token in prompt or token in output:
            value = value / repetition if value > 0 else value * repetition
        count = list(output).count(token)
        value -= frequency * count + presence * (1.0 if count > 0 else 0.0)
        out.append(value)
    return out


def test_penalties_match_reference() -> None:
    vocab = 12
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(8)) * 3
    logits[2, 5] = float("-inf")
    cases = [
        # prompt, output, repetition, frequency, presence
        ((1, 2, 2), (2, 3, 3, 3), 1.5, 0.0, 0.0),
        ((0,), (4, 4, 7), 1.0, 0.7, -0.5),
        ((5, 6), (5, 6, 6, 11), 0.8, -1.2, 2.0),
        ((1, 2), (1,), 1.0, 0.0, 0.0),  # no penalty: untouched
    ]
    expected = [reference_penalties(logits[i], *case) for i, case in enumerate(cases)]
    edited = logits.clone()
    apply_penalties(
        edited,
        prompt_ids=[c[0] for c in cases],
        output_ids=[c[1] for c in cases],
        repetition=[c[2] for c in cases],
        frequency=[c[3] for c in cases],
        presence=[c[4] for c in cases],
    )
    torch.testing.assert_close(edited, torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert torch.equal(edited[3], logits[3])


def test_penalties_steer_greedy_choice() -> None:
    logits = logits_from_probs([0.5, 0.4, 0.1])[None]
    sampler = Sampler(VOCAB, CPU)
    cases = [
        (SamplingParams(temperature=0.0, repetition_penalty=2.0), (0,), ()),  # prompt counts
        (SamplingParams(temperature=0.0, frequency_penalty=0.2), (), (0, 0)),
        (SamplingParams(temperature=0.0, presence_penalty=0.5), (), (0,)),
    ]
    for params, prompt, output in cases:
        row = make_row(params, prompt=prompt, output=output)
        assert sampler.sample(logits, [row])[0].token_id == 1, params
    # Frequency and presence penalties ignore the prompt.
    for params in (
        SamplingParams(temperature=0.0, frequency_penalty=2.0),
        SamplingParams(temperature=0.0, presence_penalty=2.0),
    ):
        assert sampler.sample(logits, [make_row(params, prompt=(0, 0, 0))])[0].token_id == 0
