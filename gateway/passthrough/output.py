"""The `Output` of a pass-through request: the engine's own events, with the client's request
id put back in place; whole, the events are collected into one `GenerateResponse`."""

from __future__ import annotations

from engine.protocol import (
    SSE_DONE,
    ChoiceCollector,
    GenerateResponse,
    Usage,
    error_body,
    sse_event,
)

_REASON_ORDER = ("error", "abort", "length")


class WireOutput:
    def __init__(
        self,
        client_request_id: str,
        *,
        n: int,
        want_logprobs: bool,
        include_usage: bool,
        stream: bool,
    ) -> None:
        self._client_request_id = client_request_id
        self._n = n
        self._include_usage = include_usage
        self._stream = stream
        self._finish: dict[int, str] = {}
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self._choices = ChoiceCollector(n, want_logprobs=want_logprobs)
        self._prompt_logprobs: GenerateResponse | None = None
        self._usage: Usage | None = None

    @property
    def finish_reason(self) -> str:
        reasons = {self._finish.get(i, "abort") for i in range(self._n)}
        return next((r for r in _REASON_ORDER if r in reasons), "stop")

    @property
    def is_done(self) -> bool:
        return len(self._finish) >= self._n

    def is_prompt_done(self, prompt: int) -> bool:
        return False  # no stop strings here: the engine ends every choice itself

    def feed(self, prompt: int, event: GenerateResponse) -> bytes:
        for choice in event.choices:
            self.num_completion_tokens += len(choice.token_ids)
            if choice.finish_reason is not None:
                self._finish.setdefault(choice.index, choice.finish_reason)
        if event.usage is not None:
            self.num_cached_tokens = event.usage.cached_tokens
        event.request_id = self._client_request_id
        if self._stream:
            if event.usage is not None and not self._include_usage:
                return b""
            return sse_event(event)
        self._collect(event)
        return b""

    def end(self, reason: str) -> bytes:
        for i in range(self._n):
            self._finish.setdefault(i, reason)
        return b""

    def head(self) -> bytes:
        return b""

    def tail(self) -> bytes:
        return SSE_DONE

    def failure(self, message: str) -> bytes:
        return sse_event(error_body(message, error_type="server_error", code=500)) + SSE_DONE

    def _collect(self, event: GenerateResponse) -> None:
        if event.prompt_logprobs is not None:
            self._prompt_logprobs = event
        if event.usage is not None:
            self._usage = event.usage
        self._choices.add(event.choices)

    def body(self) -> bytes:
        response = GenerateResponse(
            request_id=self._client_request_id,
            choices=self._choices.choices(),
            prompt_logprobs=(
                self._prompt_logprobs.prompt_logprobs if self._prompt_logprobs else None
            ),
            kv_transfer_params=None,
            usage=self._usage,
        )
        return response.model_dump_json().encode()
