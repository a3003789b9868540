"""The scheduler's rules by brute force, to check engine/scheduling/scheduler.py's index against.

The waiting line is a plain list, and its order is computed from scratch (O(n^2)) each time a
step needs it, straight from the rules in engine/scheduling/waiting_queue.py's docstring: take the band
whose oldest sequence has the smallest `priority * aging_steps + arrival_step` (ties: the
older), inside it the tenant with the smallest served-token counter (ties: the tenant whose
oldest sequence is older), inside that its oldest sequence; remove it; repeat. The step itself
is engine/scheduling/scheduler.py's, written the way it was before the index (walk the list in order).
"""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.outputs import FailedSeq, FinishReason, ScheduledSeq, SchedulerOutput
from engine.scheduling.block_manager import BlockManager, PrefixHit
from engine.scheduling.fairness import VirtualTokenCounter
from engine.scheduling.scheduler import adapter_of
from engine.scheduling.sequence import Sequence, SequenceStatus
from lora.cache import AdapterCache
from lora.registry import AdapterId


def age_key(seq: Sequence) -> tuple[int, int]:
    return (seq.arrival_order, seq.seq_id)


def line_order(
    waiting: list[Sequence], *, served: Any, aging_steps: int, by_priority: bool
) -> list[Sequence]:
    remaining = list(waiting)
    line: list[Sequence] = []

    def band(s: Sequence) -> int:
        return s.priority if by_priority else 0

    def tenant(s: Sequence) -> str:
        return s.tenant_key if by_priority else ""

    def served_of(t: str) -> int:
        return served(t) if by_priority else 0

    while remaining:
        heads: dict[int, Sequence] = {}
        for s in remaining:
            if band(s) not in heads or age_key(s) < age_key(heads[band(s)]):
                heads[band(s)] = s
        best_band = min(
            heads, key=lambda b: (b * aging_steps + heads[b].arrival_step, age_key(heads[b]))
        )
        tenant_heads: dict[str, Sequence] = {}
        for s in remaining:
            if band(s) == best_band:
                t = tenant(s)
                if t not in tenant_heads or age_key(s) < age_key(tenant_heads[t]):
                    tenant_heads[t] = s
        best_tenant = min(tenant_heads, key=lambda t: (served_of(t), age_key(tenant_heads[t])))
        chosen = tenant_heads[best_tenant]
        line.append(chosen)
        remaining.remove(chosen)
    return line


class ReferenceScheduler:
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

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.fairness.on_arrival(seq.tenant_key)
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
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

    def check_invariants(self) -> None:
        pass

    def line(self) -> list[Sequence]:
        return line_order(
            self.waiting,
            served=self.fairness.served,
            aging_steps=self.config.aging_steps,
            by_priority=self.config.policy == "priority",
        )

    def level(self, seq: Sequence) -> int:
        return seq.priority - (self.num_steps - seq.arrival_step) // self.config.aging_steps

    def rank_key(self, seq: Sequence) -> tuple[int, int]:
        if self.config.policy == "fcfs":
            return (0, seq.arrival_order)
        return (self.level(seq), seq.arrival_order)

    def schedule(self) -> SchedulerOutput:
        preempted: list[Sequence] = []
        self.running.sort(key=self.rank_key)
        if self.config.policy == "priority":
            self._preempt_for_better_waiting(preempted)
        num_preempted_for_priority = len(preempted)
        if self.adapters is not None:
            line = self.line()
            front = line[: max(0, self.config.max_num_seqs - len(self.running)) + 1]
            wanted = [adapter_of(s) for s in front]
            others = {s.adapter_id for s in self.waiting if s.adapter_id is not None}
            wanted += [AdapterId(a) for a in sorted(others) if a not in set(wanted)]
            self.adapters.plan(wanted)

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
        drained: AdapterId | None = None
        num_passed = 0
        for seq in self.line():
            if len(self.running) + len(admitted) >= self.config.max_num_seqs or budget <= 0:
                break
            adapter = adapter_of(seq)
            if adapter is not None and self.adapters is not None:
                error = self.adapters.load_error(adapter)
                if error is not None:
                    failed.append(FailedSeq(seq, f"adapter could not be loaded: {error.message}"))
                    continue
                if adapter == drained or not self.adapters.can_acquire(adapter):
                    if drained is None and not self.adapters.can_get_slot(adapter):
                        drained = self.adapters.drain_target()
                    num_passed += 1
                    if num_passed >= self.config.max_num_seqs:
                        break
                    continue
            hit = self._prefix_hit(seq)
            num_computed = hit.num_blocks * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if not self.block_manager.can_allocate(seq, num_new, hit):
                break
            if adapter is not None and self.adapters is not None:
                self.adapters.acquire(adapter)
            self.block_manager.allocate(seq, num_new, hit)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_computed
                self.block_manager.record_prefix_lookup(seq.num_prompt_tokens, num_computed)
            seq.status = SequenceStatus.RUNNING
            admitted.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
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
            # The first that can get a slot, looking past at most max_num_seqs that cannot.
            looked_at = self.line()[: self.config.max_num_seqs]
            candidate = next((s for s in looked_at if self._can_get_slot(s)), None)
            if candidate is None:
                return
            victim = self.running[-1]
            if self.level(candidate) >= self.level(victim):
                return
            if len(self.running) < self.config.max_num_seqs:
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
        preempted.append(seq)

    def _prefix_hit(self, seq: Sequence) -> PrefixHit:
        if seq.request.sampling_params.prompt_logprobs is not None:
            return PrefixHit([], [])
        return self.block_manager.find_prefix(seq)
