"""What the engine hands back per request, step by step (engine -> async engine -> server)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from engine.request import RequestId

if TYPE_CHECKING:
    from engine.scheduling.sequence import Sequence


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token at this position


@dataclass(frozen=True)
class PositionLogprobs:
    """The chosen (sampled or prompt) token's logprob plus the top-k alternatives."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...]


@dataclass
class CompletionDelta:
    """New tokens of one choice since the previous RequestOutput."""

    index: int
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None  # the stop token id that ended the choice, if any


@dataclass
class RequestTimes:
    """Monotonic timestamps for latency metrics (None until the event happened)."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass
class RequestOutput:
    request_id: RequestId
    choices: list[CompletionDelta]
    finished: bool
    num_prompt_tokens: int
    num_cached_tokens: int
    # Position 0 has no logprob (nothing precedes it): None there, as in vLLM.
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    times: RequestTimes | None = None
    error: str | None = None
    priority: int = 0
    num_output_tokens: int = field(default=0)  # cumulative over all choices


@dataclass(frozen=True)
class LoRAStats:
    """Adapter cache counters (cumulative) and slot gauges."""

    num_adapters: int  # registered
    num_slots: int  # max_loras
    num_slots_occupied: int
    num_slots_in_use: int  # held by running sequences
    num_cpu_cached: int
    gpu_hits_total: int
    gpu_misses_total: int
    cpu_hits_total: int
    cpu_misses_total: int
    loads_total: int
    load_seconds_total: float
    prefetches_total: int
    gpu_evictions_total: int
    cpu_evictions_total: int
    # Adapter names of running / waiting requests, for the Inference Extension's LoRA affinity
    # (vllm:lora_requests_info).
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()


@dataclass
class EngineStats:
    """A snapshot for /metrics and /health (cumulative counters are monotonic)."""

    num_running: int
    num_waiting: int
    kv_usage: float  # used blocks / total blocks, in [0, 1]
    num_preemptions_total: int
    prefix_cache_queries_total: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int  # of those, tokens found
    prompt_tokens_total: int
    generation_tokens_total: int
    # Served tokens per fairness key (the virtual token counter), for the fairness metric.
    served_tokens_by_tenant: dict[str, int] = field(default_factory=dict)
    lora: LoRAStats | None = None  # None when LoRA is disabled


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's share of a step: compute its next num_new_tokens positions."""

    seq: Sequence
    num_new_tokens: int

    @property
    def is_sampling(self) -> bool:
        # A sampled token follows only once every known token of the sequence is computed;
        # a partial prefill chunk produces no token.
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(frozen=True)
class FailedSeq:
    """A sequence the scheduler had to end: its adapter could not be read any more."""

    seq: Sequence
    message: str


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]
    failed: list[FailedSeq] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
