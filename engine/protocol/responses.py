"""Response shapes of the tokens-only protocol: bodies, stream events, logprobs, errors."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from engine.outputs import FinishReason, PositionLogprobs, RequestOutput
from engine.protocol.requests import GenerateRequest

# JSON has no -inf; impossible tokens get this logprob on the wire (vLLM's convention).
MIN_WIRE_LOGPROB = -9999.0

FinishReasonName = Literal["stop", "length", "abort"]
# `error` never appears as a finish reason on the wire: it becomes a 500 or an error event.
_WIRE_FINISH: dict[FinishReason, FinishReasonName] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
}


class TopLogprob(BaseModel):
    token: str  # "token_id:<id>", as vLLM renders tokens when it does not detokenize
    logprob: float
    bytes: list[int] | None = None


class LogprobContent(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[LogprobContent]


class PromptLogprob(BaseModel):
    logprob: float
    rank: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class GenerateChoice(BaseModel):
    index: int
    token_ids: list[int]
    finish_reason: FinishReasonName | None = None
    stop_reason: int | None = None
    logprobs: ChoiceLogprobs | None = None


class GenerateResponse(BaseModel):
    """The non-streaming body, and (carrying only new tokens) each streamed event."""

    request_id: str
    choices: list[GenerateChoice]
    # Position 0 is null; then {"<token id>": {"logprob", "rank"}} for the chosen token + top-k.
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    usage: Usage | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def _wire_logprob(value: float) -> float:
    return value if math.isfinite(value) else MIN_WIRE_LOGPROB


def _token(token_id: int) -> str:
    return f"token_id:{token_id}"


def render_logprobs(positions: Iterable[PositionLogprobs]) -> list[LogprobContent]:
    return [
        LogprobContent(
            token=_token(position.chosen.token_id),
            logprob=_wire_logprob(position.chosen.logprob),
            top_logprobs=[
                TopLogprob(token=_token(top.token_id), logprob=_wire_logprob(top.logprob))
                for top in position.top
            ],
        )
        for position in positions
    ]


def render_prompt_logprobs(
    positions: Iterable[PositionLogprobs | None],
) -> list[dict[str, PromptLogprob] | None]:
    rendered: list[dict[str, PromptLogprob] | None] = []
    for position in positions:
        if position is None:
            rendered.append(None)
            continue
        entry = {
            str(position.chosen.token_id): PromptLogprob(
                logprob=_wire_logprob(position.chosen.logprob), rank=position.chosen.rank
            )
        }
        for top in position.top:
            entry.setdefault(
                str(top.token_id), PromptLogprob(logprob=_wire_logprob(top.logprob), rank=top.rank)
            )
        rendered.append(entry)
    return rendered


def is_error_output(output: RequestOutput) -> bool:
    return output.error is not None or any(
        choice.finish_reason is FinishReason.ERROR for choice in output.choices
    )


class ChoiceCollector:
    """The whole choices of one answer, gathered from its events' choice deltas in order:
    token ids and logprobs appended, the first finish reason kept. Both ends of the wire
    collect so: the engine server's non-streamed body and the gateway's pass-through."""

    def __init__(self, n: int, *, want_logprobs: bool) -> None:
        self._choices = {
            index: GenerateChoice(
                index=index,
                token_ids=[],
                logprobs=ChoiceLogprobs(content=[]) if want_logprobs else None,
            )
            for index in range(n)
        }

    def add(self, deltas: Iterable[GenerateChoice]) -> None:
        for delta in deltas:
            choice = self._choices.setdefault(
                delta.index, GenerateChoice(index=delta.index, token_ids=[])
            )
            choice.token_ids.extend(delta.token_ids)
            if delta.logprobs is not None and choice.logprobs is not None:
                choice.logprobs.content.extend(delta.logprobs.content)
            if delta.finish_reason is not None and choice.finish_reason is None:
                choice.finish_reason = delta.finish_reason
                choice.stop_reason = delta.stop_reason

    def choices(self) -> list[GenerateChoice]:
        return [self._choices[index] for index in sorted(self._choices)]


class ResponseBuilder:
    """Turns one request's RequestOutputs into wire events (streaming) or one body (not).

    Feed every output to `chunk` (streaming) or `add` (non-streaming), in order.
    """

    def __init__(self, request: GenerateRequest) -> None:
        self.request_id = request.request_id
        self._kv_transfer_params = request.kv_transfer_params
        self._want_logprobs = request.sampling_params.logprobs is not None
        self._choices = ChoiceCollector(
            request.sampling_params.n, want_logprobs=self._want_logprobs
        )
        self._prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
        self._num_prompt_tokens = len(request.token_ids)
        self._num_cached_tokens = 0
        self._num_completion_tokens = 0
        self._sent_first_chunk = False

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self._num_prompt_tokens,
            completion_tokens=self._num_completion_tokens,
            cached_tokens=self._num_cached_tokens,
        )

    def _delta_choices(self, output: RequestOutput) -> list[GenerateChoice]:
        self._num_prompt_tokens = output.num_prompt_tokens
        self._num_cached_tokens = output.num_cached_tokens
        deltas = []
        for delta in sorted(output.choices, key=lambda choice: choice.index):
            finish = delta.finish_reason
            if finish is FinishReason.ERROR:
                finish = None  # errors reach the client as an error, never as a finish reason
            if not delta.token_ids and finish is None:
                continue
            self._num_completion_tokens += len(delta.token_ids)
            deltas.append(
                GenerateChoice(
                    index=delta.index,
                    token_ids=list(delta.token_ids),
                    finish_reason=_WIRE_FINISH[finish] if finish is not None else None,
                    stop_reason=delta.stop_reason,
                    logprobs=(
                        ChoiceLogprobs(content=render_logprobs(delta.logprobs or ()))
                        if self._want_logprobs
                        else None
                    ),
                )
            )
        return deltas

    def _new_prompt_logprobs(
        self, output: RequestOutput
    ) -> list[dict[str, PromptLogprob] | None] | None:
        if output.prompt_logprobs is None:
            return None
        rendered = render_prompt_logprobs(output.prompt_logprobs)
        if self._prompt_logprobs is None:
            self._prompt_logprobs = rendered
        else:
            self._prompt_logprobs.extend(rendered)
        return rendered

    def add(self, output: RequestOutput) -> None:
        self._new_prompt_logprobs(output)
        self._choices.add(self._delta_choices(output))

    def response(self) -> GenerateResponse:
        return GenerateResponse(
            request_id=self.request_id,
            choices=self._choices.choices(),
            prompt_logprobs=self._prompt_logprobs,
            kv_transfer_params=self._kv_transfer_params,
            usage=self.usage,
        )

    def chunk(self, output: RequestOutput) -> GenerateResponse | None:
        """The event for this output, or None when it carries nothing new."""
        prompt_logprobs = self._new_prompt_logprobs(output)
        choices = self._delta_choices(output)
        if not choices and prompt_logprobs is None and self._sent_first_chunk:
            return None
        # kv_transfer_params is echoed once, on the first event, not on every token.
        first = not self._sent_first_chunk
        self._sent_first_chunk = True
        return GenerateResponse(
            request_id=self.request_id,
            choices=choices,
            prompt_logprobs=prompt_logprobs,
            kv_transfer_params=self._kv_transfer_params if first else None,
        )

    def usage_chunk(self) -> GenerateResponse:
        return GenerateResponse(request_id=self.request_id, choices=[], usage=self.usage)


def error_body(
    message: str, *, error_type: str, param: str | None = None, code: int | str | None = None
) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message, type=error_type, param=param, code=code))


SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: BaseModel) -> bytes:
    """One server-sent event; compact JSON never holds a raw newline, so the framing is safe."""
    return b"data: " + payload.model_dump_json().encode() + b"\n\n"


def sse_json(payload: Mapping[str, Any]) -> bytes:
    """`sse_event` for a plain JSON object (the gateway's OpenAI chunks)."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
