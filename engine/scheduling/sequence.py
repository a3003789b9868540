"""One sequence = one choice of a request: its tokens, KV blocks and scheduling state."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from engine.outputs import FinishReason, PositionLogprobs
from engine.request import EngineRequest
from engine.structured.matcher import GrammarMatcher


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request: EngineRequest
    index: int  # choice index inside the request (0..n-1)
    # Monotonic admission order; ties in priority go to the smaller value, and a preempted
    # sequence keeps it, so it keeps its place in line.
    arrival_order: int
    arrival_step: int
    token_ids: list[int]
    num_prompt_tokens: int
    max_tokens: int  # already capped by the context length
    adapter_id: int | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose K/V are in the cache; the next forward pass starts here.
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # Hash keys of this sequence's full blocks, in order (the chain the prefix cache uses).
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_tokens: int | None = None  # prefix-cache hits at first scheduling
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None
    # Output bookkeeping: tokens and logprobs not yet handed out in a RequestOutput.
    num_emitted_tokens: int = 0
    is_finish_reported: bool = False
    pending_logprobs: list[PositionLogprobs] = field(default_factory=list)
    # Structured outputs: this choice's walk through the request's grammar (its output tokens
    # consumed, in order; engine/structured/matcher.py).
    grammar: GrammarMatcher | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def tenant_key(self) -> str:
        return self.request.tenant_key
