"""`text_completion` bodies and streamed events, with `echo` and legacy `logprobs`."""

from __future__ import annotations

from typing import Any

from gateway.choices import ChoiceDelta
from gateway.generation import Generation
from gateway.render import JSON, LegacyLogprobs, usage
from gateway.streaming import SSE_DONE, sse
from gateway.tokenizer import Tokenizer


class CompletionRenderer:
    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created: int,
        prompts: list[list[int]],
        n: int,
        tokenizer: Tokenizer,
        include_usage: bool,
        echo: bool,
        want_logprobs: bool,
    ) -> None:
        self._head = {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": model,
        }
        self._tokenizer = tokenizer
        self._prompts = prompts
        self._n = n
        self._include_usage = include_usage
        self._echo = echo
        self._want_logprobs = want_logprobs
        num_choices = len(prompts) * n
        self._echo_texts = [tokenizer.decode(p) if echo else "" for p in prompts]
        self._texts: list[list[str]] = [[] for _ in range(num_choices)]
        self._logprobs = [
            LegacyLogprobs(tokenizer, len(self._echo_texts[i // n])) for i in range(num_choices)
        ]
        self._finish: list[tuple[str | None, str | int | None]] = [(None, None)] * num_choices

    def _prompt_logprobs(self, generation: Generation, prompt: int) -> JSON | None:
        """The echoed prompt's own logprobs (position 0 has none, as in OpenAI)."""
        if not (self._echo and self._want_logprobs):
            return None
        rows = generation.prompt_logprobs[prompt] or []
        out = LegacyLogprobs(self._tokenizer)
        for position, token_id in enumerate(self._prompts[prompt]):
            row = rows[position] if position < len(rows) else None
            if row is None:
                out.add(token_id, None, None)
                continue
            chosen = row.get(str(token_id))
            top = {self._tokenizer.token_text(int(t)): e.logprob for t, e in row.items()}
            out.add(token_id, chosen.logprob if chosen is not None else None, top)
        return out.take()

    # ---- whole ---------------------------------------------------------------------------------

    def add(self, deltas: list[ChoiceDelta]) -> None:
        for d in deltas:
            self._texts[d.index].append(d.text)
            if d.logprobs:
                self._logprobs[d.index].add_sampled(d.logprobs)
            if d.finish_reason is not None:
                self._finish[d.index] = (d.finish_reason, d.stop_reason)

    def body(self, generation: Generation) -> JSON:
        choices = []
        for i, texts in enumerate(self._texts):
            prompt = i // self._n
            logprobs: JSON | None = None
            if self._want_logprobs:
                logprobs = self._logprobs[i].take()
                echoed = self._prompt_logprobs(generation, prompt)
                if echoed is not None:
                    logprobs = {k: echoed[k] + logprobs[k] for k in logprobs}
            choices.append(
                {
                    "index": i,
                    "text": self._echo_texts[prompt] + "".join(texts),
                    "logprobs": logprobs,
                    "finish_reason": self._finish[i][0],
                    "stop_reason": self._finish[i][1],
                }
            )
        return {**self._head, "choices": choices, "usage": usage(generation)}

    # ---- streamed ------------------------------------------------------------------------------

    def _chunk(self, choices: list[JSON], usage_json: JSON | None = None) -> bytes:
        payload: dict[str, Any] = {**self._head, "choices": choices}
        if self._include_usage:
            payload["usage"] = usage_json
        return sse(payload)

    def stream_start(self, generation: Generation) -> list[bytes]:
        if not self._echo:
            return []
        return [
            self._chunk(
                [
                    {
                        "index": i,
                        "text": self._echo_texts[i // self._n],
                        "logprobs": self._prompt_logprobs(generation, i // self._n),
                        "finish_reason": None,
                    }
                ]
            )
            for i in range(len(self._texts))
        ]

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            if not d.text and d.finish_reason is None and not d.logprobs:
                continue
            logprobs = None
            if self._want_logprobs:
                self._logprobs[d.index].add_sampled(d.logprobs or [])
                logprobs = self._logprobs[d.index].take()
            choice: JSON = {
                "index": d.index,
                "text": d.text,
                "logprobs": logprobs,
                "finish_reason": d.finish_reason,
            }
            if d.finish_reason is not None:
                choice["stop_reason"] = d.stop_reason
            chunks.append(self._chunk([choice]))
        return chunks

    def stream_end(self, generation: Generation) -> list[bytes]:
        tail = [self._chunk([], usage(generation))] if self._include_usage else []
        return [*tail, SSE_DONE]
