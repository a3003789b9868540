"""The `Output` of chat and completions: engine tokens -> choices -> a renderer's bytes.

Each choice detokenizes incrementally and watches for stop strings (text/choices.py); the
renderer shapes what the choices gained into `chat.completion(.chunk)` or `text_completion`
JSON. Counts are what the client was given: a choice ended by a stop string counts no token
past it, even when the engine made more before its abort arrived.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from engine.protocol import SSE_DONE, GenerateResponse, PromptLogprob, sse_json
from gateway.openai.render import JSON, error_event
from gateway.text.choices import ChoiceDelta, ChoiceState
from gateway.text.detokenizer import make_detokenizer
from gateway.text.stop_strings import StopStringFilter
from gateway.text.tokenizer import Tokenizer

PromptLogprobs = list[dict[str, PromptLogprob] | None]

# The ledger's reason for a request: the most telling over its choices, in this order.
_REASON_ORDER = ("error", "abort", "length")


class Renderer(Protocol):
    def add(self, deltas: list[ChoiceDelta]) -> None: ...

    def body(self, output: TextOutput) -> JSON: ...

    def stream_start(self, output: TextOutput) -> list[bytes]: ...

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]: ...

    def stream_end(self, output: TextOutput) -> list[bytes]: ...


class TextOutput:
    def __init__(
        self,
        tokenizer: Tokenizer,
        renderer: Renderer,
        *,
        prompts: Sequence[list[int]],
        n: int,
        stops: Sequence[str],
        include_stop: bool,
        want_logprobs: bool,
        stream: bool,
    ) -> None:
        self._renderer = renderer
        self._n = n
        self._stream = stream
        self.choices = [
            ChoiceState(
                index,
                make_detokenizer(tokenizer),
                StopStringFilter(stops, include_stop=include_stop),
                want_logprobs=want_logprobs,
            )
            for index in range(len(prompts) * n)
        ]
        self.prompt_logprobs: list[PromptLogprobs | None] = [None] * len(prompts)
        self.num_prompt_tokens = sum(len(p) for p in prompts)  # as the usage object tells it
        self.num_cached_tokens = 0

    # ---- counts --------------------------------------------------------------------------------

    @property
    def num_completion_tokens(self) -> int:
        return sum(choice.num_tokens for choice in self.choices)

    @property
    def finish_reason(self) -> str:
        reasons = {choice.finish_reason or "abort" for choice in self.choices}
        return next((r for r in _REASON_ORDER if r in reasons), "stop")

    @property
    def is_done(self) -> bool:
        return all(choice.is_finished for choice in self.choices)

    def _mine(self, prompt: int) -> list[ChoiceState]:
        return self.choices[prompt * self._n : (prompt + 1) * self._n]

    def usage(self) -> JSON:
        """The OpenAI `usage` object."""
        prompt, completion = self.num_prompt_tokens, self.num_completion_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens},
        }

    def is_prompt_done(self, prompt: int) -> bool:
        mine = self._mine(prompt)
        return all(c.is_finished for c in mine) and any(c.is_cut_short for c in mine)

    # ---- events --------------------------------------------------------------------------------

    def feed(self, prompt: int, event: GenerateResponse) -> bytes:
        if event.usage is not None:
            self.num_cached_tokens += event.usage.cached_tokens
        if event.prompt_logprobs is not None:
            self.prompt_logprobs[prompt] = event.prompt_logprobs
        mine = self._mine(prompt)
        deltas = [
            delta
            for delta in (mine[choice.index].feed(choice) for choice in event.choices)
            if delta is not None
        ]
        return self._render(deltas)

    def end(self, reason: str) -> bytes:
        return self._render([d for d in (c.end(reason) for c in self.choices) if d is not None])

    def _render(self, deltas: list[ChoiceDelta]) -> bytes:
        if not deltas:
            return b""
        if self._stream:
            return b"".join(self._renderer.stream_deltas(deltas))
        self._renderer.add(deltas)
        return b""

    # ---- the answer ----------------------------------------------------------------------------

    def head(self) -> bytes:
        return b"".join(self._renderer.stream_start(self))

    def tail(self) -> bytes:
        return b"".join(self._renderer.stream_end(self))

    def failure(self, message: str) -> bytes:
        return sse_json(error_event(message, code="engine_error")) + SSE_DONE

    def body(self) -> bytes:
        return json.dumps(self._renderer.body(self), separators=(",", ":")).encode()
