"""Sampler tests (CPU, no model): logprobs (raw, ranked, prompt logprobs), half-precision
logits, inputs left unmodified, -inf rows, the empty batch."""

from __future__ import annotations

import pytest
import torch

from engine.outputs import PositionLogprobs
from engine.sampling import sampler as sampler_module
from engine.sampling.sampler import Sampler
from engine.sampling_params import SamplingParams
from tests.engine.sampling.sampler_helpers import (
    CPU,
    VOCAB,
    make_row,
)

# --- logprobs ------------------------------------------------------------------------------


def check_position(position: PositionLogprobs, raw_logprobs: torch.Tensor, k: int) -> None:
    chosen = position.chosen
    assert chosen.logprob == pytest.approx(raw_logprobs[chosen.token_id].item(), abs=1e-5)
    assert chosen.rank == int((raw_logprobs >= raw_logprobs[chosen.token_id]).sum())
    assert len(position.top) == k
    assert [e.rank for e in position.top] == list(range(1, k + 1))
    values = [e.logprob for e in position.top]
    assert values == sorted(values, reverse=True)
    expected = raw_logprobs.topk(k).values.tolist() if k else []
    assert values == pytest.approx(expected, abs=1e-5)
    for entry in position.top:
        assert entry.logprob == pytest.approx(raw_logprobs[entry.token_id].item(), abs=1e-5)


def test_logprobs_are_raw_and_ranked() -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(9)) * 2
    rows = [
        # Processing must not leak into the logprobs.
        make_row(SamplingParams(logprobs=5, temperature=0.5, logit_bias={3: 100.0})),
        make_row(SamplingParams(logprobs=0, temperature=0.0)),
        make_row(SamplingParams(temperature=0.0)),
        make_row(SamplingParams(logprobs=20, top_k=2, repetition_penalty=1.5), output=(1,)),
    ]
    tokens = Sampler(VOCAB, CPU).sample(logits, rows)
    raw = logits.log_softmax(dim=-1)
    assert tokens[0].token_id == 3
    assert tokens[2].logprobs is None
    for i, k in ((0, 5), (1, 0), (3, 20)):
        position = tokens[i].logprobs
        assert position is not None
        check_position(position, raw[i], k)
    position = tokens[1].logprobs
    assert position is not None and position.top == () and position.chosen.rank == 1


def test_prompt_logprobs_match_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # A chunk of 3 positions exercises the chunked path on a 10-position prompt.
    monkeypatch.setattr(sampler_module, "PROMPT_LOGPROBS_CHUNK_ELEMENTS", 3 * VOCAB)
    logits = torch.randn(10, VOCAB, generator=torch.Generator().manual_seed(10))
    targets = [
        int(t) for t in torch.randint(0, VOCAB, (10,), generator=torch.Generator().manual_seed(0))
    ]
    raw = logits.log_softmax(dim=-1)
    for k in (0, 4):
        positions = Sampler(VOCAB, CPU).prompt_logprobs(logits, targets, k)
        assert [p.chosen.token_id for p in positions] == targets
        for i, position in enumerate(positions):
            check_position(position, raw[i], k)


# --- dtypes and -inf -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype: torch.dtype) -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(12)).to(dtype)
    rows = [
        make_row(SamplingParams(temperature=0.0, logprobs=2)),
        make_row(SamplingParams(top_p=0.8, seed=3, logprobs=2), seed=3),
        make_row(SamplingParams(temperature=0.0, presence_penalty=1.0), output=(0,)),
    ]
    before = logits.clone()
    tokens = Sampler(VOCAB, CPU).sample(logits, rows)
    assert torch.equal(logits, before)
    assert tokens[0].token_id == int(logits[0].float().argmax())
    raw = logits.float().log_softmax(dim=-1)
    for i in (0, 1):
        position = tokens[i].logprobs
        assert position is not None
        check_position(position, raw[i], 2)
    positions = Sampler(VOCAB, CPU).prompt_logprobs(logits, [1, 2, 3], 1)
    check_position(positions[2], raw[2], 1)


def test_input_logits_never_modified() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(13))
    before = logits.clone()
    rows = [
        make_row(SamplingParams(logit_bias={1: 5.0}, top_k=3, temperature=0.7), banned=[2]),
        make_row(SamplingParams(allowed_token_ids=(1, 2), repetition_penalty=1.2), output=(1,)),
        make_row(SamplingParams(temperature=0.0, min_p=0.3)),
    ]
    Sampler(VOCAB, CPU).sample(logits, rows)
    assert torch.equal(logits, before)
    Sampler(VOCAB, CPU).sample(logits, [make_row()] * 3)  # all random, nothing else
    assert torch.equal(logits, before)


def test_no_nan_with_heavily_masked_rows() -> None:
    logits = torch.full((4, VOCAB), float("-inf"))
    logits[:, 10] = 1.0
    logits[:, 11] = -2.0
    rows = [
        make_row(SamplingParams(top_p=0.1, min_p=0.9, temperature=0.3, logprobs=3)),
        make_row(
            SamplingParams(top_k=1, repetition_penalty=2.0, presence_penalty=-2.0), output=(3, 11)
        ),
        make_row(SamplingParams(temperature=0.0, frequency_penalty=-2.0, logprobs=3), output=(5,)),
        make_row(SamplingParams(allowed_token_ids=(11, 12), logprobs=0), banned=[11]),
    ]
    for _ in range(20):
        tokens = Sampler(VOCAB, CPU).sample(logits, rows)
        assert [t.token_id for t in tokens][:3] == [10, 10, 10]
        # Row 3: 12 is -inf in the model, 11 is banned; the ban yields rather than NaN.
        assert tokens[3].token_id == 11
        for token in tokens:
            if token.logprobs is not None:
                values = [token.logprobs.chosen.logprob] + [e.logprob for e in token.logprobs.top]
                assert not any(v != v for v in values)  # NaN is the only value != itself


def test_empty_batch() -> None:
    assert Sampler(VOCAB, CPU).sample(torch.empty(0, VOCAB), []) == []
