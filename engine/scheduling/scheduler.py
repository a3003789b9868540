"""Continuous batching with chunked prefill, priority + fair ordering, aging and preemption.

Plain Python over Sequence objects and the BlockManager; no tensors. One `schedule()` call
plans one engine step. Its ranks, taken at the step's start (`now`: the steps planned so far):

- A sequence's aged level is `priority - (now - arrival_step) // aging_steps`; lower ranks
  higher. A preempted sequence keeps its arrival step and arrival order, so its level and its
  place in line.
- The running sequences go best first by (aged level, arrival order); the choices of one
  request share an arrival order and keep their order among themselves (a stable sort). The
  last one is the worst.
- The waiting line: engine/scheduling/waiting_queue.py's order (below).

Under `fcfs` both go by arrival order alone, priorities are ignored, and step 0 is skipped.

0. Priority preemption. The candidate is the first sequence in line whose adapter can be
   pinned now (on the base model, always), looking at most `max_num_seqs` deep. While its aged
   level is strictly below the worst running sequence's and the batch is full (`max_num_seqs`
   running) or the free KV blocks cannot hold its first chunk (its prompt past its prefix-cache
   hit, at most `max_num_batched_tokens`), the worst running sequence is preempted: its blocks
   and its adapter pin are freed and it rejoins the line, to be recomputed. The candidate is
   chosen again after each preemption.
1. Running sequences, best first, get their uncomputed tokens (1 for decode, the rest of the
   prompt for prefill), capped by what is left of the token budget (`max_num_batched_tokens`);
   once it is spent the rest get nothing this step. When the free KV blocks cannot hold a
   sequence's tokens the worst running sequence is preempted until they can; if that is the one
   asking, no later one runs this step either.
2. Admission, unless step 1 preempted a sequence (after running out of KV blocks, admitting
   more would only thrash). Waiting sequences, in line order, are admitted while a seat and
   budget are left: each takes its prefix-cache hit (none with prompt logprobs, which need every
   position's logits) and schedules the rest of its prompt, capped by the budget left. The
   first one whose chunk the free KV blocks cannot hold stops admission, so a large
   high-priority prompt is not starved by smaller ones behind it. Adapters: below.
3. Each tenant's fair-share counter is charged the tokens scheduled for it this step, at the
   end of the step (so the line's order holds for the whole step).

The waiting line (engine/scheduling/waiting_queue.py). `fcfs`: arrival order. `priority`: the
sequences of one priority value form a band. Bands go in the order of their oldest sequence's
deadline `priority * aging_steps + arrival_step` (ties: the older oldest), which orders them by
that sequence's aged level, and bands of one aged level by deadline. Inside a band the tenant
with the smallest served-token counter (engine/scheduling/fairness.py) goes first (ties: the
tenant whose oldest sequence there arrived first), then that tenant's sequences in arrival
order: aging only lets one band overtake another, it never reorders tenants inside a band. A
request of priority p under a steady stream of priority-q requests (q < p) outranks every
newcomer after (p - q + 1) * aging_steps steps, so its wait is bounded by that plus the time to
serve the finitely many requests ahead of it (those that arrived before, and its own band's fair
share).

Cost. The line is an index, never sorted as a whole: a step takes sequences from its front one
at a time and puts back those it did not admit, O(log n) each for n waiting. It takes the ones
it admits, at most `max_num_seqs` it passes over (below) and the one that stops admission; a
search for a preemption candidate looks at most `max_num_seqs` deep. With nothing waiting that
outranks the worst running sequence (the common case) no search happens. Neither walk goes on
once the line's counts (per adapter, and on the base model) show that nobody left in it could
be admitted: a line of nothing but sequences waiting for a slot costs O(slots) a step, not
`max_num_seqs` pops.

Adapters. Every running sequence with an adapter pins it in one of the adapter cache's slots
(lora/cache.py; their number comes from a memory budget, engine/step/lora_setup.py), so a batch
never holds more distinct adapters than slots. In admission, a waiting sequence whose adapter's
read failed fails (that request only). One whose adapter cannot be pinned now (every slot
pinned, or not read from disk yet: reads run on the manager's worker thread) is passed over,
not a stop: the ones behind it still run; the `max_num_seqs`-th passed over ends admission. The
first one passed over whose adapter can get no slot at all (every slot pinned) picks one pinned
slot to drain (fewest running users, then least recently used): sequences behind it in line on
that adapter are passed over too, even when they could pin it, so the slot frees once its
running sequences finish and the passed-over sequence gets it; it eventually leads the line
(aging moves its band ahead, the fair-share counter its tenant), so its wait is bounded like any
other. After step 0 the cache is told which adapters the line needs: the adapter (None: the
base model) of each of the line's first `free seats + 1` sequences, in line order, then every
other adapter a waiting sequence needs, by id (the order reads start in, eviction preference).

Invariant (check_invariants): every sequence is in exactly one of waiting (status WAITING, no
KV blocks) and running (status RUNNING, at most max_num_seqs); each adapter's pins equal its
running sequences; the waiting index and the fairness counter hold their own invariants.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.config import EngineConfig
from engine.outputs import FailedSeq, FinishReason, ScheduledSeq, SchedulerOutput
from engine.scheduling.block_manager import BlockManager, PrefixHit
from engine.scheduling.fairness import VirtualTokenCounter
from engine.scheduling.sequence import Sequence, SequenceStatus
from engine.scheduling.waiting_queue import WaitingQueue
from lora.cache import AdapterCache
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
        self.fairness = VirtualTokenCounter()
        self.waiting = WaitingQueue(
            aging_steps=config.aging_steps,
            served=self.fairness.served,
            by_priority=config.policy == "priority",
        )
        self.running: list[Sequence] = []
        self.num_steps = 0
        self.num_preemptions = 0

    # -- membership ----------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.fairness.on_arrival(seq.tenant_key)
        self.waiting.add(seq)

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
        return [*self.waiting, *self.running]

    # -- ranking -------------------------------------------------------------------------

    def level(self, seq: Sequence) -> int:
        waited = self.num_steps - seq.arrival_step
        return seq.priority - waited // self.config.aging_steps

    def sort_running(self) -> None:
        """Best first: the last one is the preemption victim. By (aged level, arrival order),
        or arrival order alone under fcfs. The key is level() inlined: it runs for every
        running sequence every step."""
        if self.config.policy == "fcfs":
            self.running.sort(key=lambda seq: seq.arrival_order)
            return
        now, aging_steps = self.num_steps, self.config.aging_steps
        self.running.sort(
            key=lambda seq: (
                seq.request.priority - (now - seq.arrival_step) // aging_steps,
                seq.arrival_order,
            )
        )

    # -- the step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        preempted: list[Sequence] = []
        self.sort_running()
        # The line's first sequences, taken out in line order by the preemption search and for
        # the adapter cache's plan, and handed to admission, which goes on from there: nothing
        # enters the line while they are out (a preemption puts them back first), so they stay
        # its front and nobody is taken out twice in a step.
        front: list[Sequence] = []
        if self.config.policy == "priority":
            self._preempt_for_better_waiting(preempted, front)
        num_preempted_for_priority = len(preempted)
        if self.adapters is not None:
            num_plan = max(0, self.config.max_num_seqs - len(self.running)) + 1
            self._take_front(front, num_plan)
            self.adapters.plan(self._wanted_adapters(front, num_plan))

        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.grow(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, preempted)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            i += 1

        # After running out of KV blocks this step, admitting more would only thrash.
        failed: list[FailedSeq] = []
        if len(preempted) == num_preempted_for_priority:
            budget = self._admit_waiting(scheduled, budget, failed, front)
        else:
            for seq in front:
                self.waiting.add(seq)

        charges: Counter[str] = Counter()
        for item in scheduled:
            charges[item.seq.tenant_key] += item.num_new_tokens
        for tenant, num_tokens in charges.items():
            self.fairness.charge(tenant, num_tokens)
        self.num_steps += 1
        return SchedulerOutput(scheduled=scheduled, preempted=preempted, failed=failed)

    def _admit_waiting(
        self,
        scheduled: list[ScheduledSeq],
        budget: int,
        failed: list[FailedSeq],
        front: list[Sequence],
    ) -> int:
        """Admit from the line: `front` (already taken from it, in line order), then on."""
        passed: list[Sequence] = []  # taken from the line but not admitted: they go back
        drained: AdapterId | None = None  # the slot held back for the first passed-over one
        # Whether the rest of the line holds a sequence this step could still admit or fail
        # (None: not asked since the last acquire or drain, which are what can change it).
        # Asked once `front` is used up and a sequence is passed over: a line of nothing but
        # blocked sequences is not walked max_num_seqs deep every step for nothing.
        any_left: bool | None = None
        front.reverse()
        while len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = front.pop() if front else self.waiting.pop()
            if seq is None:
                break
            adapter = adapter_of(seq)
            if adapter is not None and self.adapters is not None:
                error = self.adapters.load_error(adapter)
                if error is not None:
                    failed.append(FailedSeq(seq, f"adapter could not be loaded: {error.message}"))
                    continue
                if adapter == drained or not self.adapters.can_acquire(adapter):
                    passed.append(seq)
                    if drained is None and not self.adapters.can_get_slot(adapter):
                        drained = self.adapters.drain_target()
                        any_left = None
                    if len(passed) >= self.config.max_num_seqs:
                        break
                    if not front:
                        if any_left is None:
                            any_left = self._line_holds_admittable(drained, failed=True)
                        if not any_left:
                            break
                    continue
            hit = self._prefix_hit(seq)
            num_computed = hit.num_blocks * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if not self.block_manager.can_allocate(seq, num_new, hit):
                passed.append(seq)
                break
            if adapter is not None and self.adapters is not None:
                self.adapters.acquire(adapter)
                any_left = None
            self.block_manager.allocate(seq, num_new, hit)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_computed
                self.block_manager.record_prefix_lookup(seq.num_prompt_tokens, num_computed)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        for seq in [*passed, *front]:
            self.waiting.add(seq)
        for item in failed:
            item.seq.status = SequenceStatus.FINISHED
            item.seq.finish_reason = FinishReason.ERROR
            self.fairness.on_finish(item.seq.tenant_key)
        return budget

    def _preempt_for_better_waiting(self, preempted: list[Sequence], front: list[Sequence]) -> None:
        """`front` (empty on entry) keeps what the candidate search took from the line when no
        preemption follows it."""
        while self.waiting and self.running:
            victim = self.running[-1]
            best = self.waiting.best_level(self.num_steps)
            if best is None or best >= self.level(victim):
                return  # nobody waiting ranks above the victim (the common case: no search)
            # Preempting for a sequence that would still find no adapter slot (or whose adapter
            # is still being read) helps nobody.
            candidate = self._first_with_slot(front)
            if candidate is None:
                return
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
            for seq in front:  # the victim joins the line: it may rank ahead of these
                self.waiting.add(seq)
            front.clear()
            self._preempt(victim, preempted)

    def _first_with_slot(self, taken: list[Sequence]) -> Sequence | None:
        """The first waiting sequence whose adapter can get a slot, looking past at most
        max_num_seqs that cannot (the same bound admission uses). Those it looks past, and the
        one it finds, are taken out of the line into `taken` (empty on entry), in line order."""
        first = self.waiting.peek()
        if first is None or self._can_get_slot(first):
            return first
        if not self._line_holds_admittable(None, failed=False):
            return None  # nobody in line has a slot: no need to walk it
        while (seq := self.waiting.pop()) is not None:
            taken.append(seq)
            if self._can_get_slot(seq):
                return seq
            if len(taken) >= self.config.max_num_seqs:
                break
        return None

    def _take_front(self, front: list[Sequence], count: int) -> None:
        """Take sequences out of the line into `front` until it holds `count` (or the line is
        empty)."""
        while len(front) < count and (seq := self.waiting.pop()) is not None:
            front.append(seq)

    def _wanted_adapters(self, front: list[Sequence], num_first: int) -> list[AdapterId | None]:
        """For the adapter cache's plan: the adapters of the line's first `num_first`, in line
        order, then every other adapter a waiting sequence needs (by id), those of the rest of
        `front` (taken out of the line by the preemption search) included."""
        wanted = [adapter_of(s) for s in front[:num_first]]
        seen = set(wanted)
        others = set(self.waiting.adapters())
        others.update(s.adapter_id for s in front[num_first:] if s.adapter_id is not None)
        wanted.extend(AdapterId(a) for a in sorted(others) if a not in seen)
        return wanted

    def _line_holds_admittable(self, drained: AdapterId | None, *, failed: bool) -> bool:
        """Whether some sequence still in the line is on the base model or on an adapter that
        can be acquired now (other than `drained`), or, with `failed`, on an adapter whose read
        failed (admission fails those). Counts from the line's index: O(slots + CPU tier)."""
        if self.waiting.num_with_adapter(None):
            return True
        if self.adapters is None:
            return bool(self.waiting)
        candidates = self.adapters.acquirable()
        if failed:
            candidates += self.adapters.failed_reads()
        return any(a != drained and self.waiting.num_with_adapter(a) for a in candidates)

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
        self.waiting.add(seq)
        preempted.append(seq)

    def _prefix_hit(self, seq: Sequence) -> PrefixHit:
        # Prompt logprobs need logits at every prompt position: no cached prefix for those.
        if seq.request.sampling_params.prompt_logprobs is not None:
            return PrefixHit([], [])
        return self.block_manager.find_prefix(seq)

    def check_invariants(self) -> None:
        assert len(self.running) <= self.config.max_num_seqs, "more running than max_num_seqs"
        running = set(self.running)
        assert len(running) == len(self.running), "a sequence runs twice"
        for seq in self.running:
            assert seq.status is SequenceStatus.RUNNING, "a running sequence is not RUNNING"
            assert seq not in self.waiting, "a sequence both waits and runs"
        for seq in self.waiting:
            assert seq.status is SequenceStatus.WAITING, "a waiting sequence is not WAITING"
            assert not seq.block_table, "a waiting sequence holds KV blocks"
        if self.adapters is not None:
            pins = Counter(a for s in self.running if (a := adapter_of(s)) is not None)
            for adapter_id, count in pins.items():
                assert self.adapters.num_in_use(adapter_id) == count, "adapter pins out of sync"
        self.waiting.check_invariants()
        self.fairness.check_invariants()
