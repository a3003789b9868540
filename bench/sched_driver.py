"""A model-free stand-in for the runner, for the scheduler benchmarks (`scheduler_scale.py`,
`fairness.py`): the real Scheduler, BlockManager and (optionally) AdapterCache, stepped the way
the engine steps them.

The runner's part is bookkeeping only: advance computed tokens, register full blocks with the
prefix cache, append one token per sampling sequence, finish at max_tokens. Only `schedule()` is
timed. A step counts as a request's first-token step when the request's first token is sampled.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.outputs import FinishReason
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence
from lora.cache import AdapterCache
from lora.registry import AdapterId


class StubSource:
    """Adapter payloads that are just names: loading and slotting cost nothing."""

    def start_load(self, adapter_id: AdapterId) -> Future[str]:
        future: Future[str] = Future()
        future.set_result(f"adapter-{adapter_id}")
        return future

    def activate(self, slot: int, adapter_id: AdapterId, payload: str) -> None:
        pass


def adapter_cache(config: EngineConfig, num_adapters: int) -> AdapterCache[Any]:
    # No model, so no slot bytes to size a pool by: 4 slots unless max_loras says otherwise.
    num_slots = config.max_loras or 4
    cache: AdapterCache[Any] = AdapterCache(
        max_loras=num_slots, max_cpu_loras=config.num_cpu_loras(num_slots), source=StubSource()
    )
    for i in range(1, num_adapters + 1):
        cache.register(AdapterId(i))
    return cache


@dataclass
class Driver:
    scheduler: Scheduler
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    first_token_step: dict[str, int] = field(default_factory=dict)
    arrival_step: dict[str, int] = field(default_factory=dict)
    num_finished: int = 0
    _num_submitted: int = 0

    @classmethod
    def create(
        cls,
        config: EngineConfig,
        *,
        num_blocks: int,
        num_adapters: int = 0,
        seed: int = 0,
    ) -> Driver:
        bm = BlockManager(num_blocks, config.block_size)
        adapters = adapter_cache(config, num_adapters) if num_adapters else None
        return cls(Scheduler(config, bm, adapters), rng=random.Random(seed))

    def submit(
        self,
        name: str,
        *,
        prompt_len: int,
        max_tokens: int,
        priority: int = 0,
        tenant: str | None = None,
        adapter_id: int | None = None,
    ) -> Sequence:
        # Random prompt tokens: no two requests share a cached prefix block.
        tokens = [self.rng.randrange(1, 30_000) for _ in range(prompt_len)]
        request = EngineRequest(
            request_id=RequestId(name),
            prompt_token_ids=tuple(tokens),
            sampling_params=SamplingParams(max_tokens=max_tokens),
            priority=priority,
            fairness_key=tenant,
        )
        order = self._num_submitted
        self._num_submitted += 1
        seq = Sequence(
            seq_id=order,
            request=request,
            index=0,
            arrival_order=order,
            arrival_step=self.scheduler.num_steps,
            token_ids=tokens,
            num_prompt_tokens=len(tokens),
            max_tokens=max_tokens,
            adapter_id=adapter_id,
        )
        self.arrival_step[name] = self.scheduler.num_steps
        self.scheduler.add(seq)
        return seq

    def step(self) -> float:
        """One engine step; returns the seconds `schedule()` took."""
        start = time.perf_counter()
        out = self.scheduler.schedule()
        elapsed = time.perf_counter() - start
        step = self.scheduler.num_steps
        bm = self.scheduler.block_manager
        for item in out.scheduled:
            seq = item.seq
            sampling = item.is_sampling
            seq.num_computed_tokens += item.num_new_tokens
            bm.cache_full_blocks(seq)
            if sampling:
                self.first_token_step.setdefault(seq.request.request_id, step)
                seq.token_ids.append(self.rng.randrange(1, 30_000))
                if seq.num_output_tokens >= seq.max_tokens:
                    seq.finish_reason = FinishReason.LENGTH
                    self.scheduler.finish(seq)
                    self.num_finished += 1
        return elapsed

    def ttft_steps(self, name: str) -> int:
        return self.first_token_step[name] - self.arrival_step[name]

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)
