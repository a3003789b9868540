"""`chat.completion` bodies and `chat.completion.chunk` events."""

from __future__ import annotations

from typing import Any

from gateway.choices import ChoiceDelta, TokenLogprob
from gateway.generation import Generation
from gateway.render import JSON, chat_logprobs, usage
from gateway.streaming import SSE_DONE, sse
from gateway.tokenizer import Tokenizer


class ChatRenderer:
    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created: int,
        num_choices: int,
        tokenizer: Tokenizer,
        include_usage: bool,
        want_logprobs: bool,
    ) -> None:
        self._head = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._tokenizer = tokenizer
        self._include_usage = include_usage
        self._want_logprobs = want_logprobs
        self._num_choices = num_choices
        self._texts: list[list[str]] = [[] for _ in range(num_choices)]
        self._logprobs: list[list[TokenLogprob]] = [[] for _ in range(num_choices)]
        self._finish: list[tuple[str | None, str | int | None]] = [(None, None)] * num_choices

    def _logprobs_json(self, entries: list[TokenLogprob] | None) -> JSON | None:
        if not self._want_logprobs:
            return None
        return {"content": chat_logprobs(self._tokenizer, entries or []), "refusal": None}

    # ---- whole ---------------------------------------------------------------------------------

    def add(self, deltas: list[ChoiceDelta]) -> None:
        for d in deltas:
            self._texts[d.index].append(d.text)
            if d.logprobs:
                self._logprobs[d.index].extend(d.logprobs)
            if d.finish_reason is not None:
                self._finish[d.index] = (d.finish_reason, d.stop_reason)

    def body(self, generation: Generation) -> JSON:
        choices = [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": "".join(self._texts[i]),
                    "refusal": None,
                },
                "logprobs": self._logprobs_json(self._logprobs[i]),
                "finish_reason": self._finish[i][0],
                "stop_reason": self._finish[i][1],
            }
            for i in range(self._num_choices)
        ]
        return {
            **self._head,
            "object": "chat.completion",
            "choices": choices,
            "usage": usage(generation),
        }

    # ---- streamed ------------------------------------------------------------------------------

    def _chunk(self, choices: list[JSON], usage_json: JSON | None = None) -> bytes:
        payload: dict[str, Any] = {**self._head, "choices": choices}
        if self._include_usage:
            payload["usage"] = usage_json
        return sse(payload)

    def stream_start(self, generation: Generation) -> list[bytes]:
        return [
            self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            for i in range(self._num_choices)
        ]

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            if not d.text and d.finish_reason is None and not d.logprobs:
                continue
            choice: JSON = {
                "index": d.index,
                "delta": {"content": d.text} if d.text else {},
                "logprobs": self._logprobs_json(d.logprobs) if d.logprobs else None,
                "finish_reason": d.finish_reason,
            }
            if d.finish_reason is not None:
                choice["stop_reason"] = d.stop_reason
            chunks.append(self._chunk([choice]))
        return chunks

    def stream_end(self, generation: Generation) -> list[bytes]:
        tail = [self._chunk([], usage(generation))] if self._include_usage else []
        return [*tail, SSE_DONE]
