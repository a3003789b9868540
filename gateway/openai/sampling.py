"""OpenAI sampling fields -> the engine's sampling params, with every limit checked.

`max_tokens` defaults to what the context leaves (or the server's `default_max_tokens`);
asking for more than the context leaves is a 400, not a silent cut. Range errors from the
engine's own checks name the field as the client spelled it (`aliases`: the engine's
`logprobs` is chat's `top_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.protocol import GenerateSamplingParams
from gateway.errors import BadRequest, ContextLengthExceeded
from gateway.lifecycle.planner import Planner
from gateway.openai.schemas import SamplingFields


@dataclass(frozen=True)
class TextSampling:
    params: GenerateSamplingParams
    stops: tuple[str, ...]
    include_stop: bool


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
) -> TextSampling:
    body.check_supported()
    settings = planner.settings
    longest = max(len(p) for p in prompts)
    room = planner.room(longest, param=prompt_param)
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
    return TextSampling(params=params, stops=stops, include_stop=body.include_stop_str_in_output)


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
