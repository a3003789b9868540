"""Generate and abort request bodies: parsing, validation and conversion to EngineRequest.

Every client-caused problem raises `InvalidRequestError` whose `param` names the field.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from engine.errors import InvalidRequestError
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutputsParams, to_structured_spec

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
# Temperatures in (0, MIN_TEMPERATURE) are raised to it, as vLLM does: below it the scaled
# logits overflow and the sampling distribution is no longer finite.
MIN_TEMPERATURE = 0.01
MAX_ID_CHARS = 512  # request_id: echoed in every chunk, so it stays short
MAX_KEY_CHARS = 1024  # cache_salt, fairness_key, model


class GenerateSamplingParams(BaseModel):
    """`sampling_params` on the wire; defaults as in vLLM. Unknown fields are a 400."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    # Grammar-constrained output (engine/protocol/structured.py); vLLM's field and names.
    structured_outputs: StructuredOutputsParams | None = None
    # Text-level fields: accepted for vLLM compatibility, ignored (the gateway handles text).
    stop: str | list[str] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class GenerateRequest(BaseModel):
    """The body of `POST /inference/v1/generate`. Unknown top-level fields are ignored."""

    model_config = ConfigDict(allow_inf_nan=False)

    request_id: str = Field(
        default_factory=lambda: str(uuid.uuid4()), min_length=1, max_length=MAX_ID_CHARS
    )
    token_ids: list[StrictInt]
    sampling_params: GenerateSamplingParams
    model: str | None = Field(default=None, max_length=MAX_KEY_CHARS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_KEY_CHARS)
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    kv_transfer_params: dict[str, Any] | None = None
    features: Any = None
    fairness_key: str | None = Field(default=None, max_length=MAX_KEY_CHARS)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class AbortRequestsBody(BaseModel):
    request_ids: list[str]


@dataclass(frozen=True)
class EngineLimits:
    """What request validation needs to know about the engine serving it."""

    vocab_size: int
    max_model_len: int
    base_model_name: str


# ---- parsing ---------------------------------------------------------------------------------


def _param_of(loc: tuple[int | str, ...]) -> str | None:
    if not loc:
        return None
    head = str(loc[0])
    if head == "sampling_params" and len(loc) > 2 and loc[1] == "structured_outputs":
        return f"{head}.structured_outputs.{loc[2]}"
    if head in ("sampling_params", "stream_options") and len(loc) > 1:
        return f"{head}.{loc[1]}"
    return head


def _invalid(exc: ValidationError) -> InvalidRequestError:
    # Messages are built from the error type and location only: pydantic's `input` may hold
    # the whole body and never goes back to the client or into a log.
    error = exc.errors(include_url=False, include_input=False)[0]
    kind = error["type"]
    param = _param_of(error["loc"])
    if kind == "json_invalid":
        detail = error.get("ctx", {}).get("error", "")
        return InvalidRequestError(f"the body is not valid UTF-8 JSON: {detail}")
    if param is None:
        return InvalidRequestError("the body must be a JSON object")
    if kind == "missing":
        return InvalidRequestError(f"{param} is required", param=param)
    if kind == "extra_forbidden":
        return InvalidRequestError(f"{param} is not a known field", param=param)
    if kind == "finite_number":
        return InvalidRequestError(f"{param} must be a finite number", param=param)
    return InvalidRequestError(f"{param}: {error['msg']}", param=param)


def _is_finite_json(value: Any, *, max_depth: int = 64) -> bool:
    """False when a NaN or infinity hides anywhere inside (JSON cannot carry them back)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return False
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def parse_generate_request(body: bytes | str) -> GenerateRequest:
    """Parse a generate body; raises InvalidRequestError (bad JSON, types, unknown fields)."""
    try:
        # Strict: a bool is not a count, "16" is not a number; typos and type slips never pass.
        request = GenerateRequest.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if request.kv_transfer_params is not None and not _is_finite_json(request.kv_transfer_params):
        raise InvalidRequestError(
            "kv_transfer_params must hold only finite numbers", param="kv_transfer_params"
        )
    return request


def parse_abort_request(body: bytes | str) -> list[RequestId]:
    try:
        parsed = AbortRequestsBody.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise _invalid(exc) from None
    return [RequestId(request_id) for request_id in parsed.request_ids]


def _check_token_ids(token_ids: list[int], vocab_size: int) -> None:
    if not token_ids:
        raise InvalidRequestError("token_ids must not be empty", param="token_ids")
    # Report the position, never the id: messages may be logged by callers.
    for position, token_id in enumerate(token_ids):
        if token_id < 0:
            raise InvalidRequestError(
                f"token ids must not be negative (token_ids[{position}])", param="token_ids"
            )
    for position, token_id in enumerate(token_ids):
        if token_id >= vocab_size:
            raise InvalidRequestError(
                f"token_ids[{position}] is outside the vocabulary [0, {vocab_size})",
                param="token_ids",
            )


def to_sampling_params(wire: GenerateSamplingParams, *, vocab_size: int) -> SamplingParams:
    """Validated engine-side sampling params (range checks name `sampling_params.<field>`)."""
    params = SamplingParams(
        n=wire.n,
        temperature=wire.temperature,
        top_p=wire.top_p,
        top_k=wire.top_k,
        min_p=wire.min_p,
        seed=wire.seed,
        max_tokens=wire.max_tokens,
        min_tokens=wire.min_tokens,
        stop_token_ids=tuple(wire.stop_token_ids),
        ignore_eos=wire.ignore_eos,
        presence_penalty=wire.presence_penalty,
        frequency_penalty=wire.frequency_penalty,
        repetition_penalty=wire.repetition_penalty,
        logprobs=wire.logprobs,
        prompt_logprobs=wire.prompt_logprobs,
        logit_bias=dict(wire.logit_bias) if wire.logit_bias is not None else None,
        allowed_token_ids=(
            tuple(wire.allowed_token_ids) if wire.allowed_token_ids is not None else None
        ),
        structured_outputs=(
            to_structured_spec(wire.structured_outputs)
            if wire.structured_outputs is not None
            else None
        ),
    )
    params.validate(vocab_size=vocab_size)
    if 0 < params.temperature < MIN_TEMPERATURE:
        params = replace(params, temperature=MIN_TEMPERATURE)
    if params.top_k >= vocab_size:
        params = replace(params, top_k=0)  # top-k over the whole vocabulary keeps every token
    return params


def to_engine_request(request: GenerateRequest, limits: EngineLimits) -> EngineRequest:
    """Every rule of the spec that needs no engine state; raises InvalidRequestError."""
    if request.features is not None:
        raise InvalidRequestError(
            "features is not supported: this engine is text-only", param="features"
        )
    _check_token_ids(request.token_ids, limits.vocab_size)
    num_prompt_tokens = len(request.token_ids)
    params = to_sampling_params(request.sampling_params, vocab_size=limits.vocab_size)
    room = limits.max_model_len - num_prompt_tokens
    if room < 1:
        raise InvalidRequestError(
            f"the prompt has {num_prompt_tokens} tokens, which leaves no room to generate within "
            f"the context length of {limits.max_model_len}",
            param="token_ids",
        )
    if params.max_tokens > room:
        params = replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
    adapter = request.model if request.model != limits.base_model_name else None
    return EngineRequest(
        request_id=RequestId(request.request_id),
        prompt_token_ids=tuple(request.token_ids),
        sampling_params=params,
        priority=request.priority,
        cache_salt=request.cache_salt,
        fairness_key=request.fairness_key,
        adapter_name=adapter,
    )
