"""The coordinator: OpenAI bodies -> token ids and engine requests; engine tokens -> text.

It owns the tokenizer (chat template, tokenization) and, through `Generation`, the way back:
incremental detokenization, stop strings (which abort the engine request), `n`, logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.protocol import GenerateRequest, GenerateSamplingParams, StreamOptions
from gateway.engine_api import EngineClient
from gateway.engine_client import check_sampling
from gateway.errors import BadRequest, ContextLengthExceeded
from gateway.generation import Generation
from gateway.policy import AdapterRef, ResolvedModel, TenantContext
from gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from gateway.settings import GatewaySettings
from gateway.tokenizer import Tokenizer


@dataclass(frozen=True)
class GenerationPlan:
    """Everything needed to run one OpenAI request on the engine, validated."""

    prompts: list[list[int]]
    params: GenerateSamplingParams
    stops: tuple[str, ...]
    include_stop: bool

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)

    @property
    def reserve_tokens(self) -> int:
        """What admission reserves: every prompt plus the most every choice can generate."""
        return self.num_prompt_tokens + len(self.prompts) * self.n * self.params.max_tokens


@dataclass(frozen=True)
class EngineTarget:
    """Where and how the tenant's requests run: set by policy, never by the client."""

    request_id: str
    ctx: TenantContext
    model: ResolvedModel
    priority: int


class Coordinator:
    def __init__(
        self, tokenizer: Tokenizer, client: EngineClient, settings: GatewaySettings
    ) -> None:
        self.tokenizer = tokenizer
        self.client = client
        self._settings = settings
        self.max_model_len = client.max_model_len
        self.vocab_size = client.vocab_size

    # ---- prompts -------------------------------------------------------------------------------

    def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        ids = self.tokenizer.encode_chat(body.template_messages())
        if not ids:
            raise BadRequest("The messages render to an empty prompt.", param="messages")
        return ids

    def completion_prompts(self, body: CompletionRequest) -> list[list[int]]:
        prompt = body.prompt
        prompts: list[list[int]]
        if isinstance(prompt, str):
            prompts = [self.tokenizer.encode(prompt)]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]  # type: ignore[arg-type]
        else:
            prompts = [
                self.tokenizer.encode(p) if isinstance(p, str) else list(p)  # type: ignore[arg-type]
                for p in prompt
            ]
        if not prompts:
            raise BadRequest("prompt must not be empty.", param="prompt")
        if len(prompts) > self._settings.max_prompts_per_request:
            raise BadRequest(
                f"At most {self._settings.max_prompts_per_request} prompts per request.",
                param="prompt",
            )
        for ids in prompts:
            self.check_token_ids(ids, param="prompt")
        return prompts

    def check_token_ids(self, ids: list[int], *, param: str) -> None:
        if not ids:
            raise BadRequest(f"{param} must not be empty.", param=param)
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < self.vocab_size:
                raise BadRequest(
                    f"{param} token {position} is outside the vocabulary [0, {self.vocab_size}).",
                    param=param,
                )

    # ---- sampling ------------------------------------------------------------------------------

    def plan(
        self,
        body: SamplingFields,
        prompts: list[list[int]],
        *,
        prompt_param: str,
        max_tokens: int | None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        aliases: dict[str, str] | None = None,
    ) -> GenerationPlan:
        """`aliases` renames engine fields to the client's in error messages."""
        body.check_supported()
        longest = max(len(p) for p in prompts)
        room = self.max_model_len - longest
        if room < 1:
            raise ContextLengthExceeded(
                f"The prompt has {longest} tokens; this model's context length is "
                f"{self.max_model_len}.",
                param=prompt_param,
            )
        if max_tokens is None:
            max_tokens = min(room, self._settings.default_max_tokens or room)
        elif max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
        elif max_tokens > room:
            raise ContextLengthExceeded(
                f"This model's context length is {self.max_model_len} tokens; the prompt has "
                f"{longest} and max_tokens asks for {max_tokens}.",
                param="max_tokens",
            )
        stops = tuple(body.stops)
        if len(stops) > self._settings.max_stop_strings or any(
            len(s) > self._settings.max_stop_string_chars for s in stops
        ):
            raise BadRequest(
                f"At most {self._settings.max_stop_strings} stop strings of "
                f"{self._settings.max_stop_string_chars} characters.",
                param="stop",
            )
        params = self._sampling(body, max_tokens, logprobs, prompt_logprobs, aliases or {})
        return GenerationPlan(
            prompts=prompts,
            params=params,
            stops=stops,
            include_stop=body.include_stop_str_in_output,
        )

    def _sampling(
        self,
        body: SamplingFields,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None,
        aliases: dict[str, str],
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
            "repetition_penalty": 1.0
            if body.repetition_penalty is None
            else body.repetition_penalty,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "logit_bias": bias,
        }
        params = GenerateSamplingParams.model_validate(fields)
        # The engine's own range checks, with the sampling_params. prefix off the field names.
        try:
            check_sampling(params, vocab_size=self.vocab_size)
        except BadRequest as exc:
            name = exc.param.removeprefix("sampling_params.") if exc.param else None
            if name in aliases:
                alias = aliases[name]
                message = exc.message.replace(f"sampling_params.{name}", alias)
                raise BadRequest(message, param=alias) from None
            raise BadRequest(exc.message.replace("sampling_params.", ""), param=name) from None
        return params

    # ---- engine requests -----------------------------------------------------------------------

    def engine_requests(self, plan: GenerationPlan, target: EngineTarget) -> list[GenerateRequest]:
        """One engine request per prompt; salt, priority, tenant and adapter from policy."""
        base = GenerateRequest(
            request_id=target.request_id,
            token_ids=[0],
            sampling_params=plan.params,
            model=target.model.engine_model,
            stream=True,
            stream_options=StreamOptions(include_usage=True),
            cache_salt=target.ctx.salt,
            priority=target.priority,
            fairness_key=target.ctx.tenant_id,
        )
        if len(plan.prompts) == 1:
            return [base.model_copy(update={"token_ids": plan.prompts[0]})]
        return [
            base.model_copy(update={"token_ids": p, "request_id": f"{target.request_id}-{i}"})
            for i, p in enumerate(plan.prompts)
        ]

    def generation(
        self, plan: GenerationPlan, requests: list[GenerateRequest], adapter: AdapterRef | None
    ) -> Generation:
        return Generation(
            self.client,
            self.tokenizer,
            requests,
            adapter=adapter,
            n=plan.n,
            stops=plan.stops,
            include_stop=plan.include_stop,
            want_logprobs=plan.params.logprobs is not None,
        )
