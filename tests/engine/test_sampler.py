"""Sampler tests: CPU, no model. Random draws are seeded, so every frequency check is
deterministic; its tolerance is still several standard deviations wide so that a different
torch RNG stream would pass too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from engine import sampler as sampler_module
from engine.logits_processors import apply_min_p, apply_penalties, apply_top_k_top_p
from engine.outputs import PositionLogprobs
from engine.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams
from kernels.cpu_layer import native_layer

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
    """The engine hands the sampler the CPU kernel's argmax (kernels/cpu_layer.py): plain greedy
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
