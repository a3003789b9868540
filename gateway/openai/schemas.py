"""OpenAI request bodies: parsing, field-level validation, and the engine sampling they ask for.

Unknown fields that do not change what is generated are ignored, as OpenAI's newer fields often
are by vLLM; fields that would change it and that this server cannot honour (audio, suffix,
the deprecated `functions`, ...) are a 400 naming the field. Output constraints
(`response_format`, vLLM's `structured_outputs` and `guided_*`) are read by structured.py,
tools by tools.py. Client-sent routing fields (`cache_salt`,
`kv_transfer_params`, `fairness_key`) are never read: the tenant's policy sets them.

`text_sampling` maps the sampling fields to the engine's: `max_tokens` defaults to what the
context leaves (or the server's `default_max_tokens`); asking for more than the context leaves
is a 400, not a silent cut. Range errors from the engine's own checks name the field as the
client spelled it (`aliases`: the engine's `logprobs` is chat's `top_logprobs`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from engine.protocol import INT64_MAX, INT64_MIN, GenerateSamplingParams
from gateway.errors import ContextLengthExceeded, UnsupportedField
from gateway.lifecycle.job import EngineTarget, Output, Plan, Planner, reserve_tokens
from gateway.openai.structured import Constraint, with_whitespace
from tenancy.errors import BadRequest

MAX_STRING_CHARS = 1 << 20  # one message, prompt or stop string (the body limit bounds the sum)
# Every integer field: the engine's range (signed 64-bit). Past it a value is a 400 naming the
# field, never clamped or dropped (a priority of 2**70 was clamped into the tier's band, a
# top_k of 2**70 disabled top-k: both answered 200).
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by chat and completions (OpenAI's, then vLLM's extras)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str = Field(min_length=1, max_length=256)
    max_tokens: Int64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: Int64 = 1
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    # vLLM extras
    top_k: Int64 | None = None
    min_p: float | None = None
    min_tokens: Int64 = 0
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    priority: Int64 | None = None
    # Output constraints (structured.py): OpenAI's, then vLLM's.
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None  # accepted and ignored: one backend here
    # Read only to refuse them (see _UNSUPPORTED).
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def check_supported(self) -> None:
        for name in _UNSUPPORTED:
            if getattr(self, name) not in (None, [], {}):
                raise UnsupportedField(name)
        if self.modalities is not None and self.modalities != ["text"]:
            raise UnsupportedField("modalities")


_UNSUPPORTED = ("functions", "function_call", "audio", "prediction", "web_search_options")


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=MAX_STRING_CHARS)


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=256)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int64 | None = None
    logprobs: bool = False
    top_logprobs: Int64 | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages as the chat template reads them: role and text content; an assistant's
        tool calls with their arguments as objects (what templates expect), a tool result
        with the id of the call it answers."""
        out: list[dict[str, Any]] = []
        for i, message in enumerate(self.messages):
            role = "system" if message.role == "developer" else message.role
            entry: dict[str, Any] = {"role": role, "content": _text_content(message.content, i)}
            if message.tool_calls:
                if role != "assistant":
                    raise BadRequest(
                        "Only assistant messages carry tool_calls.",
                        param=f"messages[{i}].tool_calls",
                    )
                entry["tool_calls"] = [
                    _template_call(call, f"messages[{i}].tool_calls[{j}]")
                    for j, call in enumerate(message.tool_calls)
                ]
            if role == "tool":
                if message.tool_call_id is None:
                    raise BadRequest(
                        "A tool message needs the tool_call_id of the call it answers.",
                        param=f"messages[{i}].tool_call_id",
                    )
                entry["tool_call_id"] = message.tool_call_id
            out.append(entry)
        return out


def _template_call(call: MessageToolCall, where: str) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.function.arguments)
    except ValueError:
        raise BadRequest(
            f"{where}.function.arguments must be a JSON object (as text).",
            param=f"{where}.function.arguments",
        ) from None
    if not isinstance(arguments, dict):
        raise BadRequest(
            f"{where}.function.arguments must be a JSON object (as text).",
            param=f"{where}.function.arguments",
        )
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


def _text_content(content: str | list[dict[str, Any]] | None, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise UnsupportedField(f"messages[{i}].content[{j}].type")
        texts.append(part["text"])
    return "\n".join(texts)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    echo: bool = False
    logprobs: Int64 | None = None
    suffix: str | None = None
    best_of: Int64 | None = None
    # chat's alone: refused here rather than ignored
    tools: Any = None
    tool_choice: Any = None

    def check_supported(self) -> None:
        super().check_supported()
        for name in ("tools", "tool_choice"):
            if getattr(self, name) is not None:
                raise UnsupportedField(name)
        if self.suffix is not None:
            raise UnsupportedField("suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise UnsupportedField("best_of")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a JSON body; the 400 names the first bad field and never quotes its value."""
    try:
        parsed = model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise _bad_request(exc) from None
    return parsed


def _bad_request(exc: ValidationError) -> BadRequest:
    error = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    kind = error["type"]
    loc = [str(part) for part in error["loc"]]
    # Unions report each member's location; the field is what matters.
    param = ".".join(p for p in loc if not p.startswith(("list[", "str", "dict[", "int")))
    if kind == "json_invalid":
        return BadRequest("The body is not valid JSON (UTF-8).", code="invalid_json")
    if kind == "model_type" and not param:
        return BadRequest("The body must be a JSON object.", code="invalid_json")
    if kind == "missing":
        return BadRequest(f"{param} is required.", param=param, code="missing_required_parameter")
    if kind == "finite_number":
        return BadRequest(f"{param} must be a finite number.", param=param)
    return BadRequest(f"Invalid value for {param}: {error['msg']}.", param=param or None)


@dataclass(frozen=True)
class BodyJob:
    """The `Job` fields every OpenAI body gives the same way (chat and completions extend it)."""

    body: SamplingFields

    @property
    def model(self) -> str:
        return self.body.model

    @property
    def priority_hint(self) -> int | None:
        return self.body.priority

    @property
    def stream(self) -> bool:
        return self.body.stream


# ---- sampling fields -> engine sampling params ------------------------------------------------


@dataclass(frozen=True)
class TextSampling:
    params: GenerateSamplingParams
    stops: tuple[str, ...]
    include_stop: bool
    # the client's name for the engine's structured_outputs parameters (lifecycle/grammars.py)
    constraint_param: Callable[[str], str] | None = None
    max_tokens_param: str = "max_tokens"  # the client's name for it (Responses: another)
    is_default_max_tokens: bool = False  # the client gave none: what the context leaves

    def plan(
        self, planner: Planner, target: EngineTarget, prompts: list[list[int]], output: Output
    ) -> Plan:
        """One engine request per prompt with these params, and what admission reserves."""
        planner.check_kv_bound(
            prompts, self.params, target, max_tokens_param=self.max_tokens_param,
            is_default_max_tokens=self.is_default_max_tokens,
        )  # fmt: skip
        return Plan(
            requests=planner.engine_requests(prompts, self.params, target),
            reserve_tokens=reserve_tokens(prompts, self.params),
            output=output,
            grammar_param=self.constraint_param,
        )


def text_sampling(
    planner: Planner,
    body: SamplingFields,
    prompts: list[list[int]],
    *,
    prompt_param: str,
    max_tokens: int | None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    aliases: dict[str, str] | None = None,
    constraint: Constraint | None = None,
) -> TextSampling:
    body.check_supported()
    settings = planner.settings
    longest = max(len(p) for p in prompts)
    room = planner.room(longest, param=prompt_param)
    is_default_max_tokens = max_tokens is None
    if max_tokens is None:
        max_tokens = min(room, settings.default_max_tokens or room)
    elif max_tokens < 1:
        raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
    elif max_tokens > room:
        raise ContextLengthExceeded(
            f"This model's context length is {planner.max_model_len} tokens; the prompt has "
            f"{longest} and max_tokens asks for {max_tokens}.",
            param="max_tokens",
        )
    stops = tuple(body.stops)
    if len(stops) > settings.max_stop_strings or any(
        len(s) > settings.max_stop_string_chars for s in stops
    ):
        raise BadRequest(
            f"At most {settings.max_stop_strings} stop strings of "
            f"{settings.max_stop_string_chars} characters.",
            param="stop",
        )
    params = _params(body, max_tokens, logprobs, prompt_logprobs)
    if constraint is not None:
        compact = settings.json_whitespace == "compact"
        params.structured_outputs = with_whitespace(constraint, compact)
        aliases = {**(aliases or {}), **constraint.aliases}
    try:
        planner.check_sampling(params)
    except BadRequest as exc:  # the engine's names carry a `sampling_params.` prefix
        name = exc.param.removeprefix("sampling_params.") if exc.param else None
        alias = (aliases or {}).get(name or "")
        if alias is not None:
            raise BadRequest(
                exc.message.replace(f"sampling_params.{name}", alias), param=alias
            ) from None
        raise BadRequest(exc.message.replace("sampling_params.", ""), param=name) from None
    return TextSampling(
        params=params,
        stops=stops,
        include_stop=body.include_stop_str_in_output,
        constraint_param=None if constraint is None else constraint.client_param,
        max_tokens_param=(aliases or {}).get("max_tokens", "max_tokens"),
        is_default_max_tokens=is_default_max_tokens,
    )


def _params(
    body: SamplingFields, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None
) -> GenerateSamplingParams:
    try:
        bias = {int(k): v for k, v in body.logit_bias.items()} if body.logit_bias else None
    except ValueError:
        raise BadRequest("logit_bias keys must be token ids.", param="logit_bias") from None
    fields: dict[str, object] = {
        "n": body.n,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": 0 if body.top_k is None else body.top_k,
        "min_p": 0.0 if body.min_p is None else body.min_p,
        "seed": body.seed,
        "max_tokens": max_tokens,
        "min_tokens": body.min_tokens,
        "stop_token_ids": list(body.stop_token_ids or []),
        "ignore_eos": body.ignore_eos,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "logit_bias": bias,
    }
    return GenerateSamplingParams.model_validate(fields)
