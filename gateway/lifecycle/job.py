"""What the lifecycle asks of each kind of inference request (chat, completions, tokens).

A route parses its body into a `Job`. The lifecycle names the request and applies policy (an
`EngineTarget`), then asks the job for its `Plan`: the engine requests to submit, what admission
reserves, and the `Output` that turns the engine's events into what the client reads. Planning
raises the client's 4xx; nothing is reserved until the plan is complete.

The `Planner` holds the checks every plan shares, whatever API the request came through: the
engine's own rules (token ids in the vocabulary, the context length, sampling ranges) are
checked before anything is reserved, so a bad request is a 400 naming the field and the engine
is never touched. `engine_requests` sets every routing field from policy: the tenant's cache
salt and fairness key, the priority clamped into its tier's band, the adapter it may see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.protocol import (
    GenerateRequest,
    GenerateResponse,
    GenerateSamplingParams,
    InvalidRequestError,
    StreamOptions,
    to_sampling_params,
)
from gateway.errors import ContextLengthExceeded
from gateway.policy import ResolvedModel, TenantContext
from gateway.settings import GatewaySettings
from gateway.text.tokenizer import Tokenizer
from tenancy.errors import BadRequest


@dataclass(frozen=True)
class EngineTarget:
    """Where and how the tenant's request runs: set by policy, never by the client."""

    request_id: str
    ctx: TenantContext
    model: ResolvedModel
    priority: int


class Output(Protocol):
    """One request's answer, built from its engine events, and its counts for the ledger.

    Streamed, `feed` returns the bytes to send for each event (`head` goes before the first);
    whole, `feed` accumulates and `body` renders the answer once the engine is done.
    """

    @property
    def num_completion_tokens(self) -> int:
        """Tokens the client was given (up to a stop string) or would have been."""
        ...

    @property
    def num_cached_tokens(self) -> int: ...

    @property
    def finish_reason(self) -> str:
        """One reason for the ledger, the most telling over all choices."""
        ...

    @property
    def is_done(self) -> bool:
        """Every choice has ended (the client's answer is complete)."""
        ...

    def feed(self, prompt: int, event: GenerateResponse) -> bytes: ...

    def is_prompt_done(self, prompt: int) -> bool:
        """Every choice of this prompt ended before its engine request did (a stop string)."""
        ...

    def end(self, reason: str) -> bytes:
        """Finish every choice still open with `reason`; returns what to send (streamed)."""
        ...

    def head(self) -> bytes:
        """Sent once, before the first event's bytes (streamed)."""
        ...

    def tail(self) -> bytes:
        """After the last event: the usage chunk, `[DONE]` (streamed)."""
        ...

    def failure(self, message: str) -> bytes:
        """An error event and `[DONE]` (streamed, after the response has started)."""
        ...

    def body(self) -> bytes:
        """The whole answer (not streamed)."""
        ...


@dataclass
class Plan:
    """A request ready to run: validated, policy applied, nothing reserved yet."""

    requests: list[GenerateRequest]  # one per prompt, in prompt order
    reserve_tokens: int  # every prompt plus the most every choice can generate
    output: Output
    # The client's name for an engine parameter of the requests' structured_outputs (a 400 of
    # lifecycle/grammars.py names it); None: the engine's own name (the tokens-only pass-through).
    grammar_param: Callable[[str], str] | None = None


class Job(Protocol):
    """A parsed inference request of one kind."""

    @property
    def id_prefix(self) -> str:
        """Of the response id: chatcmpl, cmpl, gen."""
        ...

    @property
    def model(self) -> str:
        """The model as the client named it."""
        ...

    @property
    def priority_hint(self) -> int | None: ...

    @property
    def stream(self) -> bool: ...

    def plan(self, planner: Planner, target: EngineTarget) -> Plan: ...


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
                    f"{param}[{position}] is {token_id}, outside the vocabulary "
                    f"[0, {self.vocab_size}).",
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

    def check_kv_bound(
        self,
        prompts: list[list[int]],
        params: GenerateSamplingParams,
        target: EngineTarget,
        *,
        max_tokens_param: str,
        is_default_max_tokens: bool,
    ) -> None:
        """The tier's `max_request_kv_tokens` (tenancy/settings.py): a 400 naming `n` (or the
        max tokens field when n is 1) past it. A max_tokens the client did not give (what the
        context leaves) is lowered to fit instead, as far as `min_tokens` allows."""
        bound = self.settings.tiers[target.ctx.tier].max_request_kv_tokens
        num_kv = request_kv_tokens(prompts, params)
        if num_kv <= bound:
            return
        num_prompt = sum(len(p) for p in prompts)
        if is_default_max_tokens:
            fits = (bound // params.n - num_prompt) // len(prompts)
            if fits >= max(1, params.min_tokens):
                params.max_tokens = fits
                return
        each = "" if len(prompts) == 1 else f"{len(prompts)} x "
        raise BadRequest(
            f"n x (prompt tokens + {max_tokens_param}) is {params.n} x ({num_prompt} + "
            f"{each}{params.max_tokens}) = {num_kv} tokens of KV cache; this tier allows at most "
            f"{bound} per request. Lower n or {max_tokens_param}.",
            param="n" if params.n > 1 else max_tokens_param,
        )

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


def request_kv_tokens(prompts: list[list[int]], params: GenerateSamplingParams) -> int:
    """What a request's sequences can hold in the KV cache at once: each of the n choices of
    each prompt, its prompt and all it may generate (prefix caching may share the prompts')."""
    return params.n * sum(len(p) + params.max_tokens for p in prompts)
