"""Continuous batching with chunked prefill, priority + fair ordering, aging and preemption.

Plain Python over Sequence objects and the BlockManager; no tensors. One `schedule()` call
plans one engine step:

0. Priority preemption: while the best waiting sequence ranks strictly above the worst running
   one and the batch is full (max_num_seqs) or the KV cache cannot hold its first chunk, the
   worst running sequence is preempted (its blocks are freed; it is recomputed later and keeps
   its arrival order, so its place in line).
1. Running sequences, best first, get their next tokens (1 for decode, a chunk for prefill)
   under the token budget; when KV blocks run out the worst running sequence is preempted,
   possibly the one asking.
2. Waiting sequences, best first, are admitted while seats, budget and blocks last. The first
   one that does not fit stops admission, so a large high-priority prompt is not starved by
   smaller ones behind it.

Adapters. Every running sequence with an adapter pins it in one of `max_loras` slots (the
adapter cache, lora/cache.py), so a batch never holds more distinct adapters than slots. A
waiting sequence whose adapter can get no slot (all pinned) is skipped, not a stop: the ones
behind it still run. The first such sequence in line picks one pinned slot to drain (fewest
running users): sequences behind it in line that would pin that adapter again wait too, so the
slot frees once its running sequences finish and the skipped sequence gets it; with aging it
eventually leads the line, so its wait is bounded like any other. The cache is told the
waiting line each step (prefetch, eviction preference).

Ranking. `fcfs`: arrival order. `priority`: the aged level, then (among equal levels) the
tenant's served-token counter, then arrival. A sequence's aged level is
`priority - steps_waited // aging_steps`: a request of priority p under a steady stream of
priority-q requests (q < p) outranks every newcomer after (p - q + 1) * aging_steps steps, so
its wait is bounded by that plus the time to serve the finitely many requests ahead of it.
"""

from __future__ import annotations

from typing import Any

from engine.block_manager import BlockManager, PrefixHit
from engine.config import EngineConfig
from engine.fairness import VirtualTokenCounter
from engine.outputs import FailedSeq, FinishReason, ScheduledSeq, SchedulerOutput
from engine.sequence import Sequence, SequenceStatus
from lora.cache import AdapterCache
from lora.errors import AdapterError
from lora.registry import AdapterId


def adapter_of(seq: Sequence) -> AdapterId | None:
    return None if seq.adapter_id is None else AdapterId(seq.adapter_id)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        adapters: AdapterCache[Any] | None = None,
    ):
        self.config = config
        self.block_manager = block_manager
        self.adapters = adapters
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.fairness = VirtualTokenCounter()
        self.num_steps = 0
        self.num_preemptions = 0

    # -- membership ----------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.fairness.on_arrival(seq.tenant_key)
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        self.fairness.on_finish(seq.tenant_key)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def live_sequences(self) -> list[Sequence]:
        return self.waiting + self.running

    # -- ranking -------------------------------------------------------------------------

    def level(self, seq: Sequence) -> int:
        waited = self.num_steps - seq.arrival_step
        return seq.priority - waited // self.config.aging_steps

    def admit_key(self, seq: Sequence) -> tuple[int, int, int]:
        if self.config.policy == "fcfs":
            return (0, 0, seq.arrival_order)
        return (self.level(seq), self.fairness.served(seq.tenant_key), seq.arrival_order)

    def rank_key(self, seq: Sequence) -> tuple[int, int]:
        """Order for running sequences: the last one is the preemption victim."""
        if self.config.policy == "fcfs":
            return (0, seq.arrival_order)
        return (self.level(seq), seq.arrival_order)

    # -- the step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        preempted: list[Sequence] = []
        self.running.sort(key=self.rank_key)
        self.waiting.sort(key=self.admit_key)
        if self.adapters is not None:
            self.adapters.plan([adapter_of(s) for s in self.waiting])
        if self.config.policy == "priority":
            self._preempt_for_better_waiting(preempted)
        num_preempted_for_priority = len(preempted)

        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.can_allocate(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, preempted)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            self.block_manager.allocate(seq, num_new)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            i += 1

        # After running out of KV blocks this step, admitting more would only thrash.
        failed: list[FailedSeq] = []
        if len(preempted) == num_preempted_for_priority:
            budget = self._admit_waiting(scheduled, budget, failed)

        for item in scheduled:
            self.fairness.charge(item.seq.tenant_key, item.num_new_tokens)
        self.num_steps += 1
        return SchedulerOutput(scheduled=scheduled, preempted=preempted, failed=failed)

    def _admit_waiting(
        self, scheduled: list[ScheduledSeq], budget: int, failed: list[FailedSeq]
    ) -> int:
        admitted: list[Sequence] = []
        drained: AdapterId | None = None  # the slot held back for the first skipped sequence
        for seq in self.waiting:
            if len(self.running) + len(admitted) >= self.config.max_num_seqs or budget <= 0:
                break
            adapter = adapter_of(seq)
            if (
                adapter is not None
                and self.adapters is not None
                and (adapter == drained or not self.adapters.can_acquire(adapter))
            ):
                if drained is None:
                    drained = self.adapters.drain_target()
                continue
            hit = self._prefix_hit(seq)
            num_computed = hit.num_blocks * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if not self.block_manager.can_allocate(seq, num_new, hit):
                break
            if adapter is not None and self.adapters is not None:
                try:
                    self.adapters.acquire(adapter)
                except AdapterError as exc:
                    failed.append(FailedSeq(seq, f"adapter could not be loaded: {exc.message}"))
                    continue
            self.block_manager.allocate(seq, num_new, hit)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_computed
                self.block_manager.record_prefix_lookup(seq.num_prompt_tokens, num_computed)
            seq.status = SequenceStatus.RUNNING
            admitted.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        if admitted or failed:
            gone = {id(s) for s in admitted} | {id(f.seq) for f in failed}
            self.waiting = [s for s in self.waiting if id(s) not in gone]
            self.running.extend(admitted)
        for item in failed:
            item.seq.status = SequenceStatus.FINISHED
            item.seq.finish_reason = FinishReason.ERROR
            self.fairness.on_finish(item.seq.tenant_key)
        return budget

    def _preempt_for_better_waiting(self, preempted: list[Sequence]) -> None:
        while self.waiting and self.running:
            # Preempting for a sequence that would still find no adapter slot helps nobody.
            candidate = next((s for s in self.waiting if self._can_get_slot(s)), None)
            if candidate is None:
                return
            victim = self.running[-1]
            if self.level(candidate) >= self.level(victim):
                return
            batch_full = len(self.running) >= self.config.max_num_seqs
            if not batch_full:
                hit = self._prefix_hit(candidate)
                first_chunk = min(
                    candidate.num_tokens - hit.num_blocks * self.block_manager.block_size,
                    self.config.max_num_batched_tokens,
                )
                if self.block_manager.can_allocate(candidate, first_chunk, hit):
                    return
            self._preempt(victim, preempted)

    def _can_get_slot(self, seq: Sequence) -> bool:
        adapter = adapter_of(seq)
        return adapter is None or self.adapters is None or self.adapters.can_acquire(adapter)

    def _release(self, seq: Sequence) -> None:
        adapter = adapter_of(seq)
        if adapter is not None and self.adapters is not None:
            self.adapters.release(adapter)

    def _preempt(self, seq: Sequence, preempted: list[Sequence]) -> None:
        self.running.remove(seq)
        self._release(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(seq)
        self.waiting.sort(key=self.admit_key)
        preempted.append(seq)

    def _prefix_hit(self, seq: Sequence) -> PrefixHit:
        # Prompt logprobs need logits at every prompt position: no cached prefix for those.
        if seq.request.sampling_params.prompt_logprobs is not None:
            return PrefixHit([], [])
        return self.block_manager.find_prefix(seq)
