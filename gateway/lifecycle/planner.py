"""The checks and policy every plan shares, whatever API the request came through.

The engine's own rules (token ids in the vocabulary, the context length, sampling ranges) are
checked here, before anything is reserved, so a bad request is a 400 naming the field and the
engine is never touched. `engine_requests` sets every routing field from policy: the tenant's
cache salt and fairness key, the priority clamped into its tier's band, the adapter it may see.
"""

from __future__ import annotations

from engine.protocol import (
    GenerateRequest,
    GenerateSamplingParams,
    InvalidRequestError,
    StreamOptions,
    to_sampling_params,
)
from gateway.errors import BadRequest, ContextLengthExceeded
from gateway.lifecycle.job import EngineTarget
from gateway.settings import GatewaySettings
from gateway.text.tokenizer import Tokenizer


class Planner:
    def __init__(
        self,
        tokenizer: Tokenizer,
        settings: GatewaySettings,
        *,
        vocab_size: int,
        max_model_len: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def check_token_ids(self, ids: list[int], *, param: str) -> None:
        if not ids:
            raise BadRequest(f"{param} must not be empty.", param=param)
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < self.vocab_size:
                raise BadRequest(
                    f"{param} token {position} is outside the vocabulary [0, {self.vocab_size}).",
                    param=param,
                )

    def room(self, longest: int, *, param: str) -> int:
        """Tokens the context leaves after the longest prompt (at least 1, or a 400)."""
        room = self.max_model_len - longest
        if room < 1:
            raise ContextLengthExceeded(
                f"The prompt has {longest} tokens; this model's context length is "
                f"{self.max_model_len}.",
                param=param,
            )
        return room

    def check_sampling(self, params: GenerateSamplingParams) -> None:
        """The engine's range checks (n, logprobs, penalties, ...); a 400 names the field."""
        try:
            to_sampling_params(params, vocab_size=self.vocab_size)
        except InvalidRequestError as exc:
            raise BadRequest(exc.message, param=exc.param) from None

    def engine_requests(
        self,
        prompts: list[list[int]],
        params: GenerateSamplingParams,
        target: EngineTarget,
    ) -> list[GenerateRequest]:
        """One engine request per prompt, every routing field from policy."""
        base = GenerateRequest(
            request_id=target.request_id,
            token_ids=[0],
            sampling_params=params,
            model=target.model.engine_model,
            stream=True,
            stream_options=StreamOptions(include_usage=True),
            cache_salt=target.ctx.salt,
            priority=target.priority,
            kv_transfer_params=None,
            features=None,
            fairness_key=target.ctx.tenant_id,
        )
        if len(prompts) == 1:
            return [base.model_copy(update={"token_ids": prompts[0]})]
        return [
            base.model_copy(update={"token_ids": p, "request_id": f"{target.request_id}-{i}"})
            for i, p in enumerate(prompts)
        ]


def reserve_tokens(prompts: list[list[int]], params: GenerateSamplingParams) -> int:
    """What admission reserves: every prompt plus the most every choice can generate."""
    return sum(len(p) for p in prompts) + len(prompts) * params.n * params.max_tokens
