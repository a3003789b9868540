"""A request inside the engine (engine/loop/llm_engine.py): its sequences (one per choice), timings
and sampling generators, and the per-request delta each step emits."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.outputs import CompletionDelta, PositionLogprobs, RequestOutput, RequestTimes
from engine.request import EngineRequest
from engine.scheduling.sequence import Sequence


def seeded_generators(
    seed: int | None, n: int, device: torch.device
) -> list[torch.Generator | None]:
    """One generator per choice when the request has a seed (choice i draws from seed + i, as
    vLLM's n > 1 does), none otherwise."""
    if seed is None:
        return [None] * n
    generators: list[torch.Generator | None] = []
    for i in range(n):
        gen = torch.Generator(device=device)
        gen.manual_seed((seed + i) % (2**63))
        generators.append(gen)
    return generators


@dataclass
class RequestState:
    """One request's sequences and what has been reported of them."""

    request: EngineRequest
    seqs: list[Sequence]
    times: RequestTimes
    generators: list[torch.Generator | None]
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_prompt_logprobs_emitted: int = 0
    counted_prompt: bool = False
    error: str | None = None

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def take_output(self) -> RequestOutput:
        """What changed since the last output: new tokens per choice, a finish reported once,
        the prompt logprobs once complete; stamps the finish time when the last choice ends."""
        request = self.request
        choices = []
        for seq in self.seqs:
            begin = seq.num_prompt_tokens + seq.num_emitted_tokens
            new_tokens = seq.token_ids[begin:]
            reports_finish = seq.finish_reason is not None and not seq.is_finish_reported
            if not new_tokens and not reports_finish:
                continue
            logprobs = None
            if request.sampling_params.logprobs is not None:
                logprobs, seq.pending_logprobs = seq.pending_logprobs, []
            choices.append(
                CompletionDelta(
                    index=seq.index,
                    token_ids=new_tokens,
                    logprobs=logprobs,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                )
            )
            seq.num_emitted_tokens += len(new_tokens)
            seq.is_finish_reported = seq.finish_reason is not None
        prompt_logprobs = None
        # Prompt logprobs go out once, complete, with the first output after the prefill.
        if (
            self.prompt_logprobs is not None
            and self.num_prompt_logprobs_emitted == 0
            and len(self.prompt_logprobs) == self.seqs[0].num_prompt_tokens
        ):
            prompt_logprobs = self.prompt_logprobs
            self.num_prompt_logprobs_emitted = len(prompt_logprobs)
        finished = self.is_finished
        if finished:
            self.times.finished = time.monotonic()
        first = self.seqs[0]
        return RequestOutput(
            request_id=request.request_id,
            choices=choices,
            finished=finished,
            num_prompt_tokens=first.num_prompt_tokens,
            num_cached_tokens=first.num_cached_tokens or 0,
            prompt_logprobs=prompt_logprobs,
            times=self.times,
            priority=request.priority,
            num_output_tokens=sum(s.num_output_tokens for s in self.seqs),
            error=self.error,
        )
