"""The scheduler's rules by brute force: the oracle engine/scheduling/scheduler.py is checked
against (tests/engine/scheduling/test_scheduler_reference.py, test_waiting_queue.py).

Written from the rules the docstrings state (engine/scheduling/scheduler.py for the step,
waiting_queue.py for the line, fairness.py for the counters), not from their code: plain lists,
and every order computed from scratch by its stated key whenever the step needs it (quadratic
in the line's length). Nothing here is imported from engine/scheduling but the Sequence and the block
manager; the block manager and the adapter cache are the real ones, being what the scheduler
decides over rather than what it decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.outputs import FailedSeq, FinishReason, ScheduledSeq, SchedulerOutput
from engine.scheduling.block_manager import BlockManager, PrefixHit
from engine.scheduling.sequence import Sequence, SequenceStatus
from lora.cache import AdapterCache
from lora.registry import AdapterId


def age(seq: Sequence) -> tuple[int, int]:
    """Older first: arrival order, then sequence id (the choices of one request share the
    arrival order)."""
    return (seq.arrival_order, seq.seq_id)


def line_order(
    waiting: list[Sequence], *, served: Callable[[str], int], aging_steps: int, by_priority: bool
) -> list[Sequence]:
    """The line: take the best, remove it, choose again (`best`)."""
    left = sorted(waiting, key=age)
    line: list[Sequence] = []
    while left:
        first = best(left, served=served, aging_steps=aging_steps, by_priority=by_priority)
        line.append(first)
        left.remove(first)
    return line


def best(
    waiting: list[Sequence], *, served: Callable[[str], int], aging_steps: int, by_priority: bool
) -> Sequence:
    """The first by (its band's deadline, its band's oldest, its tenant's counter, its tenant's
    oldest in the band, its own age), where a band is one priority value and its deadline is
    `priority * aging_steps + arrival_step` of its oldest. `by_priority` False (fcfs): one band,
    one tenant."""

    def band(seq: Sequence) -> int:
        return seq.priority if by_priority else 0

    def tenant(seq: Sequence) -> str:
        return seq.tenant_key if by_priority else ""

    band_oldest: dict[int, Sequence] = {}
    tenant_oldest: dict[tuple[int, str], Sequence] = {}
    for seq in sorted(waiting, key=age):  # the first one seen of a group is its oldest
        band_oldest.setdefault(band(seq), seq)
        tenant_oldest.setdefault((band(seq), tenant(seq)), seq)

    def rank(seq: Sequence) -> tuple[int, tuple[int, int], int, tuple[int, int], tuple[int, int]]:
        head = band_oldest[band(seq)]
        return (
            band(seq) * aging_steps + head.arrival_step,
            age(head),
            served(tenant(seq)) if by_priority else 0,
            age(tenant_oldest[band(seq), tenant(seq)]),
            age(seq),
        )

    return min(waiting, key=rank)


class FairShare:
    """The virtual token counter as stated: a counter of tokens served per tenant; a tenant
    with no unfinished sequence that gets one is lifted to the smallest counter among the
    tenants with unfinished sequences, never lowered. Idle tenants are never forgotten here
    (the real one forgets them beyond 10,000 tenants; the tests have a few)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.unfinished: Counter[str] = Counter()

    def served(self, tenant: str) -> int:
        return self.counters.get(tenant, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self.counters)

    def arrive(self, tenant: str) -> None:
        if self.unfinished[tenant] == 0:
            active = [self.served(t) for t, n in self.unfinished.items() if n > 0]
            self.counters[tenant] = max(self.served(tenant), min(active, default=0))
        self.unfinished[tenant] += 1

    def finish(self, tenant: str) -> None:
        self.unfinished[tenant] -= 1

    def charge(self, tenant: str, num_tokens: int) -> None:
        self.counters[tenant] = self.served(tenant) + num_tokens


class ReferenceScheduler:
    """Sim drives it as it drives the Scheduler: add, finish, schedule, and the same fields."""

    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        adapters: AdapterCache[Any] | None = None,
    ):
        self.config = config
        self.block_manager = block_manager
        self.adapters = adapters
        self.by_priority = config.policy == "priority"
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.fairness = FairShare()
        self.num_steps = 0
        self.num_preemptions = 0

    # -- membership ----------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.fairness.arrive(seq.tenant_key)
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.unpin(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        self.fairness.finish(seq.tenant_key)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def live_sequences(self) -> list[Sequence]:
        return [*self.waiting, *self.running]

    def check_invariants(self) -> None:
        assert len(self.running) <= self.config.max_num_seqs
        assert all(s.status is SequenceStatus.RUNNING for s in self.running)
        assert all(s.status is SequenceStatus.WAITING and not s.block_table for s in self.waiting)

    # -- ranks -----------------------------------------------------------------------------

    def level(self, seq: Sequence) -> int:
        """The aged level: lower ranks higher."""
        return seq.priority - (self.num_steps - seq.arrival_step) // self.config.aging_steps

    def line(self) -> list[Sequence]:
        return line_order(
            self.waiting,
            served=self.fairness.served,
            aging_steps=self.config.aging_steps,
            by_priority=self.by_priority,
        )

    def rank_running(self) -> None:
        """Best first by (aged level, arrival order), fcfs by arrival order; a stable sort, so
        ties (choices of one request) keep their order."""
        if self.by_priority:
            self.running.sort(key=lambda s: (self.level(s), s.arrival_order))
        else:
            self.running.sort(key=lambda s: s.arrival_order)

    # -- the step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.rank_running()
        preempted: list[Sequence] = []
        if self.by_priority:
            self.preempt_for_priority(preempted)
        if self.adapters is not None:
            self.adapters.plan(self.adapters_needed())
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        ran_out_of_blocks = self.run_running(scheduled, preempted, budget)
        budget -= sum(s.num_new_tokens for s in scheduled)
        failed: list[FailedSeq] = []
        if not ran_out_of_blocks:
            self.admit(scheduled, failed, budget)
        for item in scheduled:  # charged at the end: the line's order holds for the whole step
            self.fairness.charge(item.seq.tenant_key, item.num_new_tokens)
        self.num_steps += 1
        return SchedulerOutput(scheduled=scheduled, preempted=preempted, failed=failed)

    def preempt_for_priority(self, preempted: list[Sequence]) -> None:
        """Rule 0: the candidate is the first in line whose adapter can be acquired now, at most
        max_num_seqs deep; while it ranks strictly above the worst running sequence and the
        batch is full or the free blocks cannot hold its first chunk, preempt the worst."""
        while self.waiting and self.running:
            looked_at = self.line()[: self.config.max_num_seqs]
            candidates = [s for s in looked_at if self.can_pin(s)]
            if not candidates:
                return
            candidate, worst = candidates[0], self.running[-1]
            if not self.level(candidate) < self.level(worst):
                return
            if len(self.running) < self.config.max_num_seqs:
                hit = self.prefix_hit(candidate)
                first_chunk = min(
                    candidate.num_tokens - self.num_hit_tokens(hit),
                    self.config.max_num_batched_tokens,
                )
                if self.block_manager.can_allocate(candidate, first_chunk, hit):
                    return
            self.preempt(worst, preempted)

    def adapters_needed(self) -> list[AdapterId | None]:
        """For the cache's plan: the adapter (None: the base model) of each of the line's first
        free-seats + 1, in line order, then every other adapter the waiting need, by id."""
        num_first = max(0, self.config.max_num_seqs - len(self.running)) + 1
        first = [self.adapter(s) for s in self.line()[:num_first]]
        rest = {self.adapter(s) for s in self.waiting} - set(first) - {None}
        return [*first, *sorted(a for a in rest if a is not None)]

    def run_running(
        self, scheduled: list[ScheduledSeq], preempted: list[Sequence], budget: int
    ) -> bool:
        """Rule 1: best first, each its uncomputed tokens capped by the budget left, until the
        budget is spent; out of blocks, preempt the worst until they suffice, ending the phase
        if that was the one asking. Returns whether any was preempted for blocks."""
        num_before = len(preempted)
        for seq in list(self.running):
            if budget <= 0:
                break
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.can_allocate(seq, num_new) and seq in self.running:
                self.preempt(self.running[-1], preempted)
            if seq not in self.running:
                break
            self.block_manager.allocate(seq, num_new)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        return len(preempted) > num_before

    def admit(self, scheduled: list[ScheduledSeq], failed: list[FailedSeq], budget: int) -> None:
        """Rule 2: in line order while a seat and budget last. A failed adapter read fails the
        sequence; an adapter that cannot be pinned now (or is the drained one) passes it over,
        the max_num_seqs-th pass ending admission; the first whose chunk the free blocks cannot
        hold stops admission."""
        drained: AdapterId | None = None
        num_passed = 0
        for seq in self.line():
            if len(self.running) >= self.config.max_num_seqs or budget <= 0:
                break
            adapter = self.adapter(seq)
            if adapter is not None and self.adapters is not None:
                error = self.adapters.load_error(adapter)
                if error is not None:
                    self.fail(seq, f"adapter could not be loaded: {error.message}", failed)
                    continue
                if adapter == drained or not self.adapters.can_acquire(adapter):
                    if drained is None and not self.adapters.can_get_slot(adapter):
                        drained = self.adapters.drain_target()
                    num_passed += 1
                    if num_passed == self.config.max_num_seqs:
                        break
                    continue
            hit = self.prefix_hit(seq)
            num_new = min(seq.num_tokens - self.num_hit_tokens(hit), budget)
            if not self.block_manager.can_allocate(seq, num_new, hit):
                break
            if adapter is not None and self.adapters is not None:
                self.adapters.acquire(adapter)
            self.block_manager.allocate(seq, num_new, hit)
            if seq.num_cached_tokens is None:  # the hit at its first scheduling is its own
                seq.num_cached_tokens = self.num_hit_tokens(hit)
                self.block_manager.record_prefix_lookup(
                    seq.num_prompt_tokens, seq.num_cached_tokens
                )
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new

    # -- one sequence ------------------------------------------------------------------------

    def adapter(self, seq: Sequence) -> AdapterId | None:
        return None if seq.adapter_id is None else AdapterId(seq.adapter_id)

    def can_pin(self, seq: Sequence) -> bool:
        adapter = self.adapter(seq)
        return adapter is None or self.adapters is None or self.adapters.can_acquire(adapter)

    def unpin(self, seq: Sequence) -> None:
        adapter = self.adapter(seq)
        if adapter is not None and self.adapters is not None:
            self.adapters.release(adapter)

    def prefix_hit(self, seq: Sequence) -> PrefixHit:
        """None for a sequence with prompt logprobs: they need logits at every position."""
        if seq.request.sampling_params.prompt_logprobs is not None:
            return PrefixHit([], [])
        return self.block_manager.find_prefix(seq)

    def num_hit_tokens(self, hit: PrefixHit) -> int:
        return hit.num_blocks * self.block_manager.block_size

    def preempt(self, seq: Sequence, preempted: list[Sequence]) -> None:
        """Back to the line, keeping its arrival order and step; recomputed when admitted."""
        self.running.remove(seq)
        self.unpin(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(seq)
        preempted.append(seq)

    def fail(self, seq: Sequence, message: str, failed: list[FailedSeq]) -> None:
        self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = FinishReason.ERROR
        self.fairness.finish(seq.tenant_key)
        failed.append(FailedSeq(seq, message))
