"""What the lifecycle asks of each kind of inference request (chat, completions, tokens).

A route parses its body into a `Job`. The lifecycle names the request and applies policy (an
`EngineTarget`), then asks the job for its `Plan`: the engine requests to submit, what admission
reserves, and the `Output` that turns the engine's events into what the client reads. Planning
raises the client's 4xx; nothing is reserved until the plan is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.protocol import GenerateRequest, GenerateResponse
from gateway.policy import ResolvedModel, TenantContext

if TYPE_CHECKING:
    from gateway.lifecycle.planner import Planner


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
