"""Per-request sampling parameters (the engine-side form of the wire's `sampling_params`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError
from engine.structured.spec import StructuredSpec

# A request may not ask for more top-k logprobs than this (vLLM's default max_logprobs is 20).
MAX_LOGPROBS = 20
MAX_N = 64


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: Mapping[int, float] | None = field(default=None, hash=False)
    allowed_token_ids: tuple[int, ...] | None = None
    # The grammar the output must match (engine/structured/ compiles and enforces it).
    structured_outputs: StructuredSpec | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, *, vocab_size: int) -> None:
        """Raise InvalidRequestError naming the first bad field (`sampling_params.<name>`)."""

        def bad(name: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(
                f"sampling_params.{name} {why}", param=f"sampling_params.{name}"
            )

        for name in (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            if not math.isfinite(getattr(self, name)):
                raise bad(name, "must be a finite number")
        if self.n < 1 or self.n > MAX_N:
            raise bad("n", f"must be between 1 and {MAX_N}")
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (disabled) or >= 1")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        if self.max_tokens < 1:
            raise bad("max_tokens", "must be >= 1")
        if self.min_tokens < 0:
            raise bad("min_tokens", "must be >= 0")
        if self.min_tokens > self.max_tokens:
            raise bad("min_tokens", "must be <= max_tokens")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise bad(name, "must be in [-2, 2]")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be > 0")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise bad(name, f"must be null or between 0 and {MAX_LOGPROBS}")
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < vocab_size:
                raise bad(
                    "stop_token_ids", f"holds {token_id}, outside the vocabulary [0, {vocab_size})"
                )
        if self.logit_bias is not None:
            for token_id, bias in self.logit_bias.items():
                if not 0 <= token_id < vocab_size:
                    raise bad("logit_bias", f"holds token id {token_id}, outside the vocabulary")
                if not (math.isfinite(bias) and -100 <= bias <= 100):
                    raise bad("logit_bias", "values must be in [-100, 100]")
        if self.allowed_token_ids is not None and self.structured_outputs is not None:
            # the two can leave no token at all, and the grammar decides what may follow
            raise bad("allowed_token_ids", "cannot be combined with structured_outputs")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise bad("allowed_token_ids", "must not be empty")
            for token_id in self.allowed_token_ids:
                if not 0 <= token_id < vocab_size:
                    raise bad("allowed_token_ids", f"holds {token_id}, outside the vocabulary")
