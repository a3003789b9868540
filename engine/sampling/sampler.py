"""Next-token selection for one batch of logits rows, with vLLM v1 sampler semantics.

Order per row: logits in float32 -> the grammar's mask (structured outputs) -> logit_bias ->
allowed_token_ids -> banned ids -> repetition penalty -> frequency and presence penalties; then
greedy rows take the argmax and the others go through temperature -> min_p -> top_k -> top_p ->
an exponential race. Logprobs are those of the raw model logits (vLLM's default
`raw_logprobs`), except in a row with a grammar: there they are the logprobs of the constrained
distribution, the raw logits renormalised over the tokens the grammar allows (every other token
has probability 0), so a reported top token is always one the grammar could have produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llguidance
import torch

from engine.outputs import PositionLogprobs, TokenLogprob
from engine.sampling.logits_processors import (
    apply_allowed_token_ids,
    apply_logit_bias,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    ban_token_ids,
)
from engine.sampling_params import SamplingParams
from engine.structured.masks import MaskOps, fill_bitmask
from engine.structured.matcher import GrammarMatcher

_NEG_INF = float("-inf")
# A temperature below this is greedy, as in vLLM: dividing by it could overflow float32.
SAMPLING_EPS = 1e-5
# Prompt logprobs run this many [position, vocab] elements at a time, so a long prompt never
# holds its whole float32 log_softmax (and the rank comparison) at once.
PROMPT_LOGPROBS_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class SamplingRow:
    """One row of the logits batch: one sequence (one choice of a request)."""

    params: SamplingParams
    # The request's seeded generator, on the logits' device; None shares the sampler's.
    generator: torch.Generator | None
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    # Ids that must not be sampled this step (EOS/stop ids while under min_tokens).
    banned_token_ids: Sequence[int]
    # The sequence's grammar (structured outputs): only tokens it allows are sampled.
    grammar: GrammarMatcher | None = None


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    # Set when params.logprobs is not None: the chosen token plus params.logprobs top entries.
    logprobs: PositionLogprobs | None


@dataclass(frozen=True)
class GrammarMasks:
    """The step's grammar masks: bitmask rows are the batch's rows (engine/structured/masks.py)."""

    bitmask: torch.Tensor  # [num_rows, ceil(vocab / 32)] int32
    rows: list[int]  # the rows that have a grammar


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < SAMPLING_EPS


def reads_token_history(params: SamplingParams) -> bool:
    """Whether a row with these params reads its prompt and output ids (the penalties); where
    not, a SamplingRow may leave them empty."""
    return _has_penalty(params)


def _has_penalty(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _needs_edit(row: SamplingRow) -> bool:
    """Whether a greedy row's choice depends on more than the argmax (and its grammar)."""
    params = row.params
    return (
        bool(params.logit_bias)
        or params.allowed_token_ids is not None
        or bool(row.banned_token_ids)
        or _has_penalty(params)
    )


class Sampler:
    def __init__(
        self,
        vocab_size: int,
        device: torch.device,
        seed: int = 0,
        argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
        grammar_threads: int = 1,
        mask_ops: MaskOps | None = None,
    ):
        """`argmax`: the greedy rows' argmax over raw logits where it beats torch's (the CPU's
        native kernel, kernels/cpu/layer.py, handed over only for CPU engines whose dtype it
        takes); it must pick as `Tensor.argmax` does."""
        self.vocab_size = vocab_size
        self.device = device
        self._argmax = argmax
        # Randomness of every row without its own seed; greedy rows never draw from it.
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(seed)
        # Grammar masks of many rows are computed on llguidance's own threads (native code,
        # outside the GIL); made on first use.
        self._grammar_threads = grammar_threads
        self._grammar_executor: llguidance.LLExecutor | None = None
        self._mask_ops = mask_ops if mask_ops is not None else MaskOps(None)

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[SampledToken]:
        """logits: [num_rows, vocab] of any float dtype; never modified."""
        num_rows = len(rows)
        assert logits.shape == (num_rows, self.vocab_size), (tuple(logits.shape), num_rows)
        if num_rows == 0:
            return []
        random_rows = [i for i, row in enumerate(rows) if not is_greedy(row.params)]
        masks = self._grammar_masks(rows)
        if not random_rows and not any(_needs_edit(row) for row in rows):
            # float32 conversion is exact, so the argmax (ties included) is the same; on CPU the
            # float32 argmax is ~2x faster than a bf16 one even counting the conversion, and
            # the native one (no copy, vectorised, rows spread over the threads) faster still:
            # 64 x 16384 bf16 logits in 0.27 ms against 0.77 (2-core AMX Xeon). Grammar rows
            # keep this path: the masked argmax reads the same logits, skipping masked words.
            if masks is not None:
                token_ids = self._mask_ops.argmax(logits, masks.bitmask)
            elif self._argmax is not None:
                token_ids = self._argmax(logits)
            else:
                token_ids = logits.float().argmax(dim=-1)  # [num_rows]
        else:
            processed = self._process(logits, rows, masks)  # [num_rows, vocab] float32
            token_ids = self._choose(processed, rows, random_rows)  # [num_rows]
        logprobs = self._sampled_logprobs(logits, token_ids, rows, masks)
        return [
            SampledToken(token_id=token_id, logprobs=position)
            for token_id, position in zip(token_ids.tolist(), logprobs, strict=True)
        ]

    def prompt_logprobs(
        self, logits: torch.Tensor, target_ids: Sequence[int], k: int
    ) -> list[PositionLogprobs]:
        """logits: [n, vocab] at prompt positions; target_ids[i] is the token after position i."""
        num_positions = logits.shape[0]
        assert logits.shape == (num_positions, self.vocab_size), tuple(logits.shape)
        assert len(target_ids) == num_positions, (len(target_ids), num_positions)
        targets = torch.tensor(target_ids, dtype=torch.long, device=logits.device)  # [n]
        chunk = max(1, PROMPT_LOGPROBS_CHUNK_ELEMENTS // self.vocab_size)
        out: list[PositionLogprobs] = []
        for start in range(0, num_positions, chunk):
            end = min(start + chunk, num_positions)
            logprobs = logits[start:end].log_softmax(dim=-1, dtype=torch.float32)  # [chunk, vocab]
            out.extend(_position_logprobs(logprobs, targets[start:end], [k] * (end - start)))
        return out

    def _grammar_masks(self, rows: Sequence[SamplingRow]) -> GrammarMasks | None:
        matchers = [(i, row.grammar) for i, row in enumerate(rows) if row.grammar is not None]
        if not matchers:
            return None
        if self._grammar_executor is None and self._grammar_threads > 1:
            self._grammar_executor = llguidance.LLExecutor(self._grammar_threads)
        bitmask = fill_bitmask(matchers, len(rows), self.vocab_size, self._grammar_executor)
        return GrammarMasks(bitmask, [i for i, _ in matchers])

    def _process(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], masks: GrammarMasks | None
    ) -> torch.Tensor:
        """The edits that also steer greedy rows, applied to a float32 copy of the logits."""
        x = logits.to(torch.float32, copy=True)  # [num_rows, vocab]
        if masks is not None:
            self._mask_ops.apply(x, masks.bitmask, masks.rows)
        params = [row.params for row in rows]
        apply_logit_bias(x, [p.logit_bias for p in params])
        apply_allowed_token_ids(x, [p.allowed_token_ids for p in params])
        ban_token_ids(x, [row.banned_token_ids for row in rows])
        if any(_has_penalty(p) for p in params):
            apply_penalties(
                x,
                prompt_ids=[row.prompt_token_ids for row in rows],
                output_ids=[row.output_token_ids for row in rows],
                repetition=[p.repetition_penalty for p in params],
                frequency=[p.frequency_penalty for p in params],
                presence=[p.presence_penalty for p in params],
            )
        return x

    def _choose(
        self, processed: torch.Tensor, rows: Sequence[SamplingRow], random_rows: list[int]
    ) -> torch.Tensor:
        """Argmax for greedy rows, a random draw for the others; returns [num_rows] long."""
        if not random_rows:
            return processed.argmax(dim=-1)
        if len(random_rows) == len(rows):
            return self._sample_random(processed, rows)
        # Greedy argmax first: the random rows are sampled from a copy, processed stays intact.
        token_ids = processed.argmax(dim=-1)  # [num_rows]
        index = torch.tensor(random_rows, dtype=torch.long, device=processed.device)
        token_ids[index] = self._sample_random(processed[index], [rows[i] for i in random_rows])
        return token_ids

    def _sample_random(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """logits: [num_random, vocab] float32, ours to edit; returns [num_random] long."""
        params = [row.params for row in rows]
        if any(p.temperature != 1.0 for p in params):
            temperature = torch.tensor(
                [p.temperature for p in params], dtype=torch.float32, device=logits.device
            )  # [num_random]
            logits.div_(temperature.unsqueeze(1))
        # vLLM applies min_p (an argmax-invariant logits processor) before top-k/top-p.
        apply_min_p(logits, [p.min_p for p in params])
        apply_top_k_top_p(logits, [p.top_k for p in params], [p.top_p for p in params])
        probs = logits.softmax(dim=-1)  # [num_random, vocab]
        # Exponential race: argmax(p / q) with q ~ Exp(1) draws token t with probability p_t.
        return probs.div_(self._exponential(rows)).argmax(dim=-1)

    def _exponential(self, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """q ~ Exp(1), [num_random, vocab]; a seeded row's q comes only from its own generator."""
        vocab, device = self.vocab_size, self.device
        q = torch.empty(len(rows), vocab, dtype=torch.float32, device=device)  # [num_random, vocab]
        shared = [i for i, row in enumerate(rows) if row.generator is None]
        if len(shared) == len(rows):
            q.exponential_(generator=self._generator)
        else:
            if shared:
                index = torch.tensor(shared, dtype=torch.long, device=device)
                q[index] = torch.empty(len(shared), vocab, device=device).exponential_(
                    generator=self._generator
                )
            for i, row in enumerate(rows):
                if row.generator is not None:
                    # A fresh [vocab] draw per row: the values depend on the seed and the step
                    # only, never on the batch around the row.
                    q[i] = torch.empty(vocab, device=device).exponential_(generator=row.generator)
        # A draw of exactly 0 would make p / q inf (or NaN for a masked token) and win the race.
        return q.clamp_min_(torch.finfo(torch.float32).tiny)

    def _sampled_logprobs(
        self,
        logits: torch.Tensor,
        token_ids: torch.Tensor,
        rows: Sequence[SamplingRow],
        masks: GrammarMasks | None,
    ) -> list[PositionLogprobs | None]:
        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        out: list[PositionLogprobs | None] = [None] * len(rows)
        if not wanted:
            return out
        if len(wanted) == len(rows):
            raw, chosen = logits, token_ids  # [num_rows, vocab], [num_rows]
        else:
            index = torch.tensor(wanted, dtype=torch.long, device=logits.device)
            raw, chosen = logits[index], token_ids[index]  # [num_wanted, vocab], [num_wanted]
        if masks is not None:  # the constrained distribution in grammar rows (module docstring)
            grammar_rows = set(masks.rows)
            constrained = [j for j, i in enumerate(wanted) if i in grammar_rows]
            if constrained:
                raw = raw.to(torch.float32, copy=True)
                self._mask_ops.apply(raw, masks.bitmask[wanted].contiguous(), constrained)
        logprobs = raw.log_softmax(dim=-1, dtype=torch.float32)  # [num_wanted, vocab]
        ks = [rows[i].params.logprobs or 0 for i in wanted]
        for i, position in zip(wanted, _position_logprobs(logprobs, chosen, ks), strict=True):
            out[i] = position
        return out


def _position_logprobs(
    logprobs: torch.Tensor, chosen: torch.Tensor, ks: Sequence[int]
) -> list[PositionLogprobs]:
    """logprobs: [n, vocab] float32; chosen: [n] long; ks[i] top entries for row i.

    The chosen token's rank counts the tokens at least as likely (vLLM's
    `batched_count_greater_than`); the top entries are ranked 1..k by position.
    """
    chosen_logprob = logprobs.gather(1, chosen.unsqueeze(1))  # [n, 1]
    ranks = (logprobs >= chosen_logprob).sum(dim=-1)  # [n]
    max_k = min(max(ks, default=0), logprobs.shape[1])
    top_values: list[list[float]] = [[] for _ in ks]
    top_ids: list[list[int]] = [[] for _ in ks]
    if max_k > 0:
        top = logprobs.topk(max_k, dim=-1)  # values, indices: [n, max_k], descending
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    out = []
    for token_id, logprob, rank, k, values, ids in zip(
        chosen.tolist(),
        chosen_logprob.squeeze(1).tolist(),
        ranks.tolist(),
        ks,
        top_values,
        top_ids,
        strict=True,
    ):
        # a token a grammar rules out (logprob -inf) is never among the top: it could not be
        # sampled, and JSON has no -inf
        top_k = tuple(
            TokenLogprob(token_id=t, logprob=v, rank=r)
            for r, (t, v) in enumerate(zip(ids[:k], values[:k], strict=True), start=1)
            if v != _NEG_INF
        )
        out.append(
            PositionLogprobs(
                chosen=TokenLogprob(token_id=token_id, logprob=logprob, rank=rank), top=top_k
            )
        )
    return out
