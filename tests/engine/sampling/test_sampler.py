"""Sampler tests: CPU, no model. Random draws are seeded, so every frequency check is
deterministic; its tolerance is still several standard deviations wide so that a different
torch RNG stream would pass too."""

from __future__ import annotations

import pytest
import torch

from engine.sampling.logits_processors import apply_min_p, apply_top_k_top_p
from engine.sampling.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams
from kernels.cpu.layer import native_layer
from tests.engine.sampling.sampler_helpers import (
    CPU,
    VOCAB,
    assert_frequencies,
    logits_from_probs,
    make_row,
    sample_many,
)

# --- greedy ----------------------------------------------------------------------------------


def test_greedy_is_argmax() -> None:
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [make_row(SamplingParams(temperature=0.0))] * 8
    tokens = Sampler(VOCAB, CPU).sample(logits, rows)
    assert [t.token_id for t in tokens] == logits.argmax(dim=-1).tolist()
    assert all(t.logprobs is None for t in tokens)


def test_greedy_tie_breaks_to_lowest_id() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, [7, 3, 20]] = 5.0
    tokens = Sampler(VOCAB, CPU).sample(logits, [make_row(SamplingParams(temperature=0.0))])
    assert tokens[0].token_id == 3


def test_greedy_rows_take_the_native_argmax_where_given() -> None:
    """The engine hands the sampler the CPU kernel's argmax (kernels/cpu/layer.py): plain greedy
    batches use it on the raw bf16 logits, picking what torch picks (ties: the lowest id); rows
    with edits (a penalty here) keep the processed float32 path."""
    native = native_layer()
    calls = []

    def argmax(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.dtype)
        return native.argmax(x)

    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(4)).bfloat16()
    logits[2, [9, 4]] = 30.0
    sampler = Sampler(VOCAB, CPU, argmax=argmax)
    greedy = [make_row(SamplingParams(temperature=0.0))] * 6
    tokens = sampler.sample(logits, greedy)
    assert [t.token_id for t in tokens] == logits.float().argmax(dim=-1).tolist()
    assert tokens[2].token_id == 4 and calls == [torch.bfloat16]
    penalised = [make_row(SamplingParams(temperature=0.0, presence_penalty=0.5))] * 6
    sampler.sample(logits, penalised)
    assert calls == [torch.bfloat16]


def test_tiny_temperature_is_greedy() -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2)) * 50
    rows = [make_row(SamplingParams(temperature=1e-30))] * 4
    tokens = Sampler(VOCAB, CPU).sample(logits, rows)
    assert [t.token_id for t in tokens] == logits.argmax(dim=-1).tolist()


def test_greedy_rows_consume_no_randomness() -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3))
    random_row = make_row()
    greedy_rows = [
        [make_row(SamplingParams(temperature=0.0))],  # the no-edit argmax shortcut
        [make_row(SamplingParams(temperature=0.0, logit_bias={1: 1.0}), output=(2,), banned=[3])],
        [make_row(SamplingParams(temperature=0.0, repetition_penalty=1.5), prompt=(4,))],
    ]
    plain, interleaved = Sampler(VOCAB, CPU, seed=5), Sampler(VOCAB, CPU, seed=5)
    expected = [plain.sample(logits, [random_row])[0].token_id for _ in range(20)]
    got = []
    for step in range(20):
        interleaved.sample(logits, greedy_rows[step % len(greedy_rows)])
        got.append(interleaved.sample(logits, [random_row])[0].token_id)
    assert len(set(expected)) > 1
    assert got == expected


# --- temperature, top_k, top_p, min_p ----------------------------------------------------


def test_temperature_one_follows_softmax() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    counts = sample_many(logits_from_probs(probs), SamplingParams())
    assert_frequencies(counts, dict(enumerate(probs)))


def test_temperature_sharpens_and_flattens() -> None:
    logits = logits_from_probs([0.5, 0.3, 0.15, 0.05])
    for temperature in (0.5, 2.0):
        expected = (logits[:4] / temperature).softmax(dim=-1).tolist()
        counts = sample_many(logits, SamplingParams(temperature=temperature))
        assert_frequencies(counts, dict(enumerate(expected)))


def test_top_k_restricts_support() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    counts = sample_many(logits_from_probs(probs), SamplingParams(top_k=2))
    assert_frequencies(counts, {0: 0.4 / 0.7, 1: 0.3 / 0.7})


@pytest.mark.parametrize("top_k", [0, -1, VOCAB, 10 * VOCAB])
def test_top_k_disabled_values(top_k: int) -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    counts = sample_many(logits_from_probs(probs), SamplingParams(top_k=top_k))
    assert_frequencies(counts, dict(enumerate(probs)))


def test_top_p_restricts_support() -> None:
    # Ascending tail masses 0.05, 0.20, 0.50: those <= 1 - 0.7 drop, so ids 2 and 3 go.
    counts = sample_many(logits_from_probs([0.5, 0.3, 0.15, 0.05]), SamplingParams(top_p=0.7))
    assert_frequencies(counts, {0: 0.5 / 0.8, 1: 0.3 / 0.8})


def test_min_p_restricts_support() -> None:
    # Threshold 0.2 * 0.5 = 0.1 removes only id 3.
    counts = sample_many(logits_from_probs([0.5, 0.3, 0.15, 0.05]), SamplingParams(min_p=0.2))
    assert_frequencies(counts, {0: 0.5 / 0.95, 1: 0.3 / 0.95, 2: 0.15 / 0.95})


def test_min_p_applies_before_top_p() -> None:
    # vLLM's order. min_p 0.25 drops id 3 (0.1 < 0.1125); renormalised, id 2 holds 0.2 / 0.9,
    # below 1 - top_p, so top_p drops it too. With top_p first, id 2 would survive.
    params = SamplingParams(min_p=0.25, top_p=0.75)
    counts = sample_many(logits_from_probs([0.45, 0.25, 0.2, 0.1]), params)
    assert_frequencies(counts, {0: 0.45 / 0.7, 1: 0.25 / 0.7})


def test_top_k_and_top_p_together() -> None:
    # top_k 3 leaves 0.4, 0.3, 0.2 (renormalised 4/9, 3/9, 2/9); top_p 0.6 then drops id 2.
    params = SamplingParams(top_k=3, top_p=0.6)
    counts = sample_many(logits_from_probs([0.4, 0.3, 0.2, 0.1]), params)
    assert_frequencies(counts, {0: 4 / 7, 1: 3 / 7})


def test_filters_treat_each_row_as_if_alone() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    # (top_k, top_p, min_p) -> the ids that survive
    cases = [
        ((2, 1.0, 0.0), {0, 1}),
        ((0, 0.7, 0.0), {0, 1}),  # tail masses 0.1, 0.3 <= 0.3 drop
        ((0, 1.0, 0.0), {0, 1, 2, 3}),
        ((3, 0.6, 0.0), {0, 1}),
        ((-1, 1.0, 0.3), {0, 1, 2}),  # threshold 0.12
        ((1, 1.0, 0.0), {0}),
    ]
    logits = logits_from_probs(probs).expand(len(cases), -1).contiguous()  # [rows, vocab]
    batch = logits.clone()
    apply_min_p(batch, [c[0][2] for c in cases])
    apply_top_k_top_p(batch, [c[0][0] for c in cases], [c[0][1] for c in cases])
    for i, ((top_k, top_p, min_p), support) in enumerate(cases):
        alone = logits[i : i + 1].clone()
        apply_min_p(alone, [min_p])
        apply_top_k_top_p(alone, [top_k], [top_p])
        assert torch.equal(batch[i], alone[0]), (i, cases[i])
        assert set(torch.nonzero(batch[i] > float("-inf")).flatten().tolist()) == support
        kept = sorted(support)
        assert torch.equal(batch[i, kept], logits[i, kept])  # survivors keep their logits


# --- seeds ---------------------------------------------------------------------------------


def test_same_seed_same_tokens_alone_and_in_any_batch() -> None:
    gen = torch.Generator().manual_seed(11)
    num_steps, batch = 6, 16
    step_logits = [torch.randn(batch, VOCAB, generator=gen) for _ in range(num_steps)]
    target = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(),
        SamplingParams(top_k=5, min_p=0.05),
        SamplingParams(temperature=1.3, top_p=0.5, seed=99),
        SamplingParams(temperature=0.0, repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.5, logprobs=3),
    ]

    def run(position: int | None) -> list[int]:
        """The target's tokens over num_steps, alone (None) or at `position` in the batch."""
        sampler = Sampler(VOCAB, CPU, seed=position or 0)
        target_gen = torch.Generator().manual_seed(1234)
        other_gens = [torch.Generator().manual_seed(99) for _ in range(batch)]
        tokens: list[int] = []
        for logits in step_logits:
            target_row = SamplingRow(target, target_gen, (1, 2), tokens, ())
            if position is None:
                out = sampler.sample(logits[:1], [target_row])
                tokens.append(out[0].token_id)
                continue
            rows = []
            for i in range(batch):
                params = others[i % len(others)]
                gen_i = other_gens[i] if params.seed is not None else None
                rows.append(SamplingRow(params, gen_i, (1, 2), (3,), ()))
            rows[position] = target_row
            # The target's row of logits is the same in every run.
            batch_logits = logits.roll(position, dims=0)
            out = sampler.sample(batch_logits, rows)
            tokens.append(out[position].token_id)
        return tokens

    alone = run(None)
    assert len(set(alone)) > 1  # a real random stream, not a degenerate argmax
    for position in (0, 5, 15):
        assert run(position) == alone


def test_different_seeds_give_different_streams() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: the token is the generator's choice alone
    first_tokens = {
        Sampler(VOCAB, CPU).sample(logits, [make_row(seed=seed)])[0].token_id for seed in range(20)
    }
    assert len(first_tokens) > 5
