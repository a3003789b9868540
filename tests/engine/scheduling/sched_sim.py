"""A model-free stand-in for the runner, to drive the scheduler step by step in tests.

It plays the runner's bookkeeping role only (advance computed tokens, append one token per
sampling sequence, finish at max_tokens); the scheduler and block manager under test are real.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.outputs import FinishReason, SchedulerOutput
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence


@dataclass
class Sim:
    scheduler: Scheduler
    finished: list[Sequence] = field(default_factory=list)
    first_token_step: dict[str, int] = field(default_factory=dict)
    finish_step: dict[str, int] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    @classmethod
    def create(cls, num_blocks: int = 1024, block_size: int = 4, **config: object) -> Sim:
        engine_config = EngineConfig(model="unused", block_size=block_size, **config)  # type: ignore[arg-type]
        bm = BlockManager(num_blocks, block_size)
        return cls(Scheduler(engine_config, bm))

    @property
    def block_manager(self) -> BlockManager:
        return self.scheduler.block_manager

    def add(
        self,
        name: str,
        prompt: list[int] | int = 8,
        *,
        max_tokens: int = 4,
        priority: int = 0,
        tenant: str | None = None,
        salt: str | None = None,
        adapter_id: int | None = None,
    ) -> Sequence:
        (seq,) = self.add_choices(
            name, prompt, max_tokens=max_tokens, priority=priority, tenant=tenant, salt=salt,
            adapter_id=adapter_id,
        )  # fmt: skip
        return seq

    def add_choices(
        self,
        name: str,
        prompt: list[int] | int = 8,
        *,
        n: int = 1,
        max_tokens: int = 4,
        priority: int = 0,
        tenant: str | None = None,
        salt: str | None = None,
        adapter_id: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> list[Sequence]:
        """A request of `n` choices, as the engine adds one: a sequence each, sharing the
        request and its arrival order."""
        tokens = list(range(1, prompt + 1)) if isinstance(prompt, int) else list(prompt)
        request = EngineRequest(
            request_id=RequestId(name),
            prompt_token_ids=tuple(tokens),
            sampling_params=SamplingParams(
                max_tokens=max_tokens, n=n, prompt_logprobs=prompt_logprobs
            ),
            priority=priority,
            cache_salt=salt,
            fairness_key=tenant,
        )
        order = next(self._ids)
        seqs = []
        for index in range(n):
            seq = Sequence(
                seq_id=order if index == 0 else next(self._ids),
                request=request,
                index=index,
                arrival_order=order,
                arrival_step=self.scheduler.num_steps,
                token_ids=list(tokens),
                num_prompt_tokens=len(tokens),
                max_tokens=max_tokens,
                adapter_id=adapter_id,
            )
            self.scheduler.add(seq)
            seqs.append(seq)
        return seqs

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        step = self.scheduler.num_steps
        for item in out.scheduled:
            seq = item.seq
            sampling = item.is_sampling
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
            if sampling:
                name = seq.request.request_id
                self.first_token_step.setdefault(name, step)
                # A token that depends on the sequence, so recompute paths are checked too.
                seq.token_ids.append((sum(seq.token_ids) * 31 + len(seq.token_ids)) % 1000)
                if seq.num_output_tokens >= seq.max_tokens:
                    seq.finish_reason = FinishReason.LENGTH
                    self.scheduler.finish(seq)
                    self.finished.append(seq)
                    self.finish_step[name] = step
        self.block_manager.check_invariants(self.scheduler.live_sequences())
        self.scheduler.check_invariants()
        return out

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.num_unfinished:
                return
            self.step()
        raise AssertionError("simulation did not finish")

    def finish_order(self) -> list[str]:
        return [s.request.request_id for s in self.finished]
