"""Pieces of OpenAI responses shared by chat and completions: the envelope of bodies and
chunks, the whole answer gathered from its deltas, logprobs and error events."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.protocol import SSE_DONE, sse_json
from gateway.lifecycle.job import EngineTarget
from gateway.text.choices import ChoiceDelta, TokenLogprob
from gateway.text.tokenizer import Tokenizer

JSON = dict[str, Any]


class Envelope:
    """What wraps every chat and completions answer: the head (id, object, created, model) of
    its body and of each chunk, and the `usage` that a stream carries only when asked for
    (`stream_options.include_usage`): null on each chunk, then one chunk of its own."""

    def __init__(
        self, *, response_id: str, object: str, created: int, model: str, include_usage: bool
    ) -> None:
        self._head = {"id": response_id, "object": object, "created": created, "model": model}
        self._include_usage = include_usage

    @classmethod
    def now(cls, target: EngineTarget, object: str, *, include_usage: bool) -> Envelope:
        """The envelope of the answer to `target`'s request, created now."""
        return cls(
            response_id=target.request_id,
            object=object,
            created=int(time.time()),
            model=target.model.name,
            include_usage=include_usage,
        )

    def body(self, choices: list[JSON], usage: JSON, *, object: str | None = None) -> JSON:
        """The whole answer; `object` where its name differs from the chunks' (chat's)."""
        head = self._head if object is None else {**self._head, "object": object}
        return {**head, "choices": choices, "usage": usage}

    def chunk(self, choices: list[JSON]) -> bytes:
        return self._event(choices, None)

    def stream_end(self, usage: JSON) -> list[bytes]:
        tail = [self._event([], usage)] if self._include_usage else []
        return [*tail, SSE_DONE]

    def _event(self, choices: list[JSON], usage: JSON | None) -> bytes:
        payload: JSON = {**self._head, "choices": choices}
        if self._include_usage:
            payload["usage"] = usage
        return sse_json(payload)


@dataclass
class ChoiceSoFar:
    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class Answer:
    """The choices of an answer sent whole, gathered from their deltas as the engine's events
    arrive (a streamed answer sends each delta instead)."""

    def __init__(self, num_choices: int) -> None:
        self.choices = [ChoiceSoFar() for _ in range(num_choices)]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        for d in deltas:
            choice = self.choices[d.index]
            choice.pieces.append(d.text)
            if d.logprobs:
                choice.logprobs.extend(d.logprobs)
            if d.finish_reason is not None:
                choice.finish_reason, choice.stop_reason = d.finish_reason, d.stop_reason


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
