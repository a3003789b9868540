"""Pieces of OpenAI responses shared by chat and completions: logprobs and error events."""

from __future__ import annotations

from typing import Any

from gateway.text.choices import TokenLogprob
from gateway.text.tokenizer import Tokenizer

JSON = dict[str, Any]


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> list[JSON]:
    """OpenAI chat `logprobs.content` entries."""

    def one(token_id: int, logprob: float) -> JSON:
        raw = tokenizer.bytes_of(token_id)
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }

    return [
        {**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
        for e in entries
    ]


class LegacyLogprobs:
    """The completions API's `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""

    def __init__(self, tokenizer: Tokenizer, offset: int = 0) -> None:
        self._tokenizer = tokenizer
        self.offset = offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, logprob: float | None, top: dict[str, float] | None) -> None:
        text = self._tokenizer.token_text(token_id)
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def add_sampled(self, entries: list[TokenLogprob]) -> None:
        for e in entries:
            top = {self._tokenizer.token_text(t): lp for t, lp in e.top}
            self.add(e.token_id, e.logprob, top)

    def take(self) -> JSON:
        """The entries added since the last take (streaming sends each chunk's own)."""
        out = {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return out


def error_event(message: str, *, error_type: str = "server_error", code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
