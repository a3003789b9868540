"""`/inference/v1/generate` passed through with the tenant's policy applied.

The client's body is parsed by the engine's own wire schema; then every routing field is set by
policy: a fresh engine request id (the client's id is restored in every answer, so tenants never
share an id space), the tenant's cache salt, its fairness key, a priority clamped into its tier's
band, the adapter it may see, and no `kv_transfer_params`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from engine.protocol import (
    ChoiceLogprobs,
    GenerateChoice,
    GenerateRequest,
    GenerateResponse,
    StreamOptions,
    Usage,
)
from gateway.engine_api import EngineStream


def policy_request(
    wire: GenerateRequest,
    *,
    request_id: str,
    salt: str,
    tenant_id: str,
    priority: int,
    engine_model: str | None,
    max_tokens: int,
) -> GenerateRequest:
    params = wire.sampling_params.model_copy(update={"max_tokens": max_tokens})
    return GenerateRequest(
        request_id=request_id,
        token_ids=wire.token_ids,
        sampling_params=params,
        model=engine_model,
        stream=True,
        stream_options=StreamOptions(include_usage=True),
        cache_salt=salt,
        priority=priority,
        kv_transfer_params=None,
        features=None,
        fairness_key=tenant_id,
    )


class Relay:
    """Counts what passes through (the Accounting of a pass-through request)."""

    def __init__(self, request: GenerateRequest, client_request_id: str) -> None:
        self._client_request_id = client_request_id
        self.num_prompt_tokens = len(request.token_ids)
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self.engine_wait_s = 0.0
        self.first_token_at: float | None = None
        self._finish: dict[int, str] = {}
        self._num_choices = request.sampling_params.n
        self.failed = False

    @property
    def finish_reason(self) -> str:
        if self.failed:
            return "error"
        reasons = [self._finish.get(i, "abort") for i in range(self._num_choices)]
        for reason in ("abort", "length"):
            if reason in reasons:
                return reason
        return "stop"

    async def events(self, stream: EngineStream) -> AsyncIterator[GenerateResponse]:
        """The engine's events with the client's request id back in place."""
        iterator = stream.__aiter__()
        while True:
            started = time.perf_counter()
            try:
                event = await iterator.__anext__()
            except StopAsyncIteration:
                return
            finally:
                self.engine_wait_s += time.perf_counter() - started
            for choice in event.choices:
                self.num_completion_tokens += len(choice.token_ids)
                if choice.finish_reason is not None:
                    self._finish[choice.index] = choice.finish_reason
            if self.first_token_at is None and any(c.token_ids for c in event.choices):
                self.first_token_at = time.perf_counter()
            if event.usage is not None:
                self.num_cached_tokens = event.usage.cached_tokens
            event.request_id = self._client_request_id
            yield event


class Collector:
    """The non-streaming body, assembled from the events."""

    def __init__(self, request_id: str, n: int, want_logprobs: bool) -> None:
        self._request_id = request_id
        self._choices = {
            i: GenerateChoice(
                index=i,
                token_ids=[],
                logprobs=ChoiceLogprobs(content=[]) if want_logprobs else None,
            )
            for i in range(n)
        }
        self._prompt_logprobs: GenerateResponse | None = None
        self._usage: Usage | None = None

    def add(self, event: GenerateResponse) -> None:
        if event.prompt_logprobs is not None:
            self._prompt_logprobs = event
        if event.usage is not None:
            self._usage = event.usage
        for delta in event.choices:
            choice = self._choices.setdefault(
                delta.index, GenerateChoice(index=delta.index, token_ids=[])
            )
            choice.token_ids.extend(delta.token_ids)
            if delta.logprobs is not None and choice.logprobs is not None:
                choice.logprobs.content.extend(delta.logprobs.content)
            if delta.finish_reason is not None and choice.finish_reason is None:
                choice.finish_reason = delta.finish_reason
                choice.stop_reason = delta.stop_reason

    def response(self) -> GenerateResponse:
        return GenerateResponse(
            request_id=self._request_id,
            choices=[self._choices[i] for i in sorted(self._choices)],
            prompt_logprobs=(
                self._prompt_logprobs.prompt_logprobs if self._prompt_logprobs else None
            ),
            kv_transfer_params=None,
            usage=self._usage,
        )
