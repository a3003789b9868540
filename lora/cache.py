"""The adapter cache tiers as a plain-Python policy: disk store -> CPU cache -> accelerator slots.

The policy never touches a tensor: an `AdapterSource` does the work (disk -> CPU payload,
payload -> slot), so tests drive it with stand-in payloads. Disk reads are asynchronous: the
source starts a read and hands back a `Future` (the manager runs it on a worker thread), the
cache records it as pending and `plan` (once per step) collects the reads that finished. A
sequence whose adapter is still being read cannot be admitted (`can_acquire` is False), like
one whose adapter finds no slot; the engine loop never waits on the disk. A read that fails
leaves its `AdapterError` for the admission of the step that collected it (`load_error`), which
fails the sequences waiting for it; the next request for that adapter reads it again.

Invariants (check_invariants):

- at most `max_loras` adapters hold a slot; the CPU tier's payloads plus the reads in flight
  are at most `max_cpu_loras` (a read reserves its CPU entry when it starts, so a finished read
  always has a place);
- an adapter in use by a running sequence holds a slot, and neither its slot nor its CPU
  payload (if it has one) is evicted until its last user releases it;
- acquire fills a slot only from a CPU payload already read, never from the disk;
- an adapter marked for removal leaves every tier only once no live sequence uses it;
- eviction prefers what no waiting request needs, then what is needed latest, then the least
  recently used; `plan` (with the waiting queue's adapters in line order) records that and
  starts reads for the adapters the line needs, first needed first.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from lora.errors import AdapterError
from lora.registry import AdapterId

P = TypeVar("P")
Tier = Literal["disk", "cpu", "gpu"]
_NOT_WANTED = 1 << 62


class AdapterSource(Protocol[P]):
    def start_load(self, adapter_id: AdapterId) -> Future[P]:
        """Start reading disk -> CPU payload off the engine loop. The future fails with an
        AdapterError if the adapter can no longer be read."""
        ...

    def activate(self, slot: int, adapter_id: AdapterId, payload: P) -> None:
        """Copy a payload into an accelerator slot (overwriting whatever it held)."""
        ...


@dataclass
class CacheStats:
    gpu_hits: int = 0  # acquire found the adapter in a slot
    gpu_misses: int = 0  # acquire had to fill a slot
    cpu_hits: int = 0  # ...from a CPU payload that was there before the line needed it
    cpu_misses: int = 0  # ...from one a disk read brought in for it
    num_loads: int = 0  # disk reads finished (failed ones included)
    # From each read's start to the step that collected it, as the engine loop sees it.
    load_seconds: float = 0.0
    num_prefetches: int = 0  # disk reads started (all of them ahead of admission)
    gpu_evictions: int = 0
    cpu_evictions: int = 0


class AdapterCache(Generic[P]):
    def __init__(
        self,
        *,
        max_loras: int,
        max_cpu_loras: int,
        source: AdapterSource[P],
        max_pending_loads: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})")
        if max_pending_loads < 1:
            raise ValueError(f"max_pending_loads must be >= 1, got {max_pending_loads}")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self._source = source
        self._max_pending = max_pending_loads
        self._clock = clock
        self._known: set[AdapterId] = set()
        self._cpu: OrderedDict[AdapterId, P] = OrderedDict()  # first = least recently used
        # Reads in flight, with their start time; each holds one CPU entry's room.
        self._pending: dict[AdapterId, tuple[Future[P], float]] = {}
        self._fresh: set[AdapterId] = set()  # in the CPU tier by a read, not yet slotted
        self._errors: dict[AdapterId, AdapterError] = {}  # reads that failed, this step
        self._slots: list[AdapterId | None] = [None] * max_loras
        self._slot_of: dict[AdapterId, int] = {}
        self._slot_used_at = [0] * max_loras
        self._tick = 0
        self._in_use: Counter[AdapterId] = Counter()
        self._unloading: set[AdapterId] = set()
        # adapter -> index in the waiting line of the first request that needs it
        self._wanted: dict[AdapterId, int] = {}
        self.stats = CacheStats()

    # -- queries -------------------------------------------------------------------------

    def tier(self, adapter_id: AdapterId) -> Tier:
        if adapter_id in self._slot_of:
            return "gpu"
        return "cpu" if adapter_id in self._cpu else "disk"

    def is_known(self, adapter_id: AdapterId) -> bool:
        return adapter_id in self._known

    def is_loading(self, adapter_id: AdapterId) -> bool:
        return adapter_id in self._pending

    def load_error(self, adapter_id: AdapterId) -> AdapterError | None:
        """The error of this adapter's read if the last `plan` collected it failed."""
        return self._errors.get(adapter_id)

    def num_in_use(self, adapter_id: AdapterId) -> int:
        return self._in_use[adapter_id]

    def slot_of(self, adapter_id: AdapterId) -> int | None:
        return self._slot_of.get(adapter_id)

    @property
    def num_occupied_slots(self) -> int:
        return len(self._slot_of)

    @property
    def num_pinned_slots(self) -> int:
        return sum(1 for a in self._slot_of if self._in_use[a] > 0)

    @property
    def num_cpu(self) -> int:
        return len(self._cpu)

    @property
    def num_pending_loads(self) -> int:
        return len(self._pending)

    def can_get_slot(self, adapter_id: AdapterId) -> bool:
        """It holds a slot, or one is free or unpinned (whether it is read yet or not)."""
        return adapter_id in self._slot_of or self._evictable_slot() is not None

    def can_acquire(self, adapter_id: AdapterId) -> bool:
        """acquire() would succeed now: in a slot, or read into the CPU tier with a slot to go
        to. False while its disk read is in flight."""
        if adapter_id in self._slot_of:
            return True
        return adapter_id in self._cpu and self._evictable_slot() is not None

    def acquirable(self) -> list[AdapterId]:
        """Every adapter can_acquire() holds for now: those in a slot and, while some slot is
        free or unpinned, those read into the CPU tier."""
        adapters = list(self._slot_of)
        if self._evictable_slot() is not None:
            adapters.extend(a for a in self._cpu if a not in self._slot_of)
        return adapters

    def failed_reads(self) -> list[AdapterId]:
        """The adapters whose read the last `plan` collected as failed (see load_error)."""
        return list(self._errors)

    def drain_target(self) -> AdapterId | None:
        """When nothing is evictable: the slot to stop feeding so that it frees soonest (fewest
        running users, then least recently used). Stable from step to step while drained."""
        held = [(self._in_use[a], self._slot_used_at[s], a) for s, a in enumerate(self._slots)
                if a is not None]  # fmt: skip
        return min(held)[2] if held else None

    # -- membership ----------------------------------------------------------------------

    def register(self, adapter_id: AdapterId, payload: P | None = None) -> None:
        """Know an adapter; a payload already read (by the load endpoint) goes into the CPU
        tier if there is room or an evictable entry."""
        self._known.add(adapter_id)
        if payload is not None and adapter_id not in self._cpu and adapter_id not in self._pending:
            self._insert_cpu(adapter_id, payload, before=_NOT_WANTED)

    def begin_unregister(self, adapter_id: AdapterId) -> None:
        """Mark for removal: it goes (finish_unregisters) once no live sequence uses it."""
        if adapter_id in self._known:
            self._unloading.add(adapter_id)

    def is_unloading(self, adapter_id: AdapterId) -> bool:
        return adapter_id in self._unloading

    @property
    def unloading(self) -> frozenset[AdapterId]:
        return frozenset(self._unloading)

    def finish_unregisters(self, live: Collection[AdapterId | None]) -> list[AdapterId]:
        """Unregister every adapter marked for removal that neither a running sequence (a pin)
        nor any other live (waiting) sequence uses; returns those removed."""
        done = [a for a in self._unloading if not self._in_use[a] and a not in live]
        for adapter_id in done:
            self.unregister(adapter_id)
        return done

    def unregister(self, adapter_id: AdapterId) -> None:
        if self._in_use[adapter_id]:
            raise RuntimeError("unregister() of an adapter in use")
        self._unloading.discard(adapter_id)
        self._known.discard(adapter_id)
        self._cpu.pop(adapter_id, None)
        self._fresh.discard(adapter_id)
        self._errors.pop(adapter_id, None)
        pending = self._pending.pop(adapter_id, None)
        if pending is not None:
            pending[0].cancel()  # a read already running finishes; its payload is dropped
        slot = self._slot_of.pop(adapter_id, None)
        if slot is not None:
            self._slots[slot] = None
        self._wanted.pop(adapter_id, None)
        del self._in_use[adapter_id]

    # -- pins ----------------------------------------------------------------------------

    def acquire(self, adapter_id: AdapterId) -> int:
        """Pin the adapter in a slot for one running sequence; returns the slot. Fills the
        slot from the CPU tier if needed (never from the disk: see can_acquire)."""
        if adapter_id not in self._known:
            raise KeyError(adapter_id)
        slot = self._slot_of.get(adapter_id)
        if slot is not None:
            self.stats.gpu_hits += 1
        else:
            slot = self._evictable_slot()
            payload = self._cpu.get(adapter_id)
            if slot is None or payload is None:
                raise RuntimeError("acquire() without can_acquire(): no slot or not read yet")
            self.stats.gpu_misses += 1
            if adapter_id in self._fresh:
                self._fresh.discard(adapter_id)
                self.stats.cpu_misses += 1
            else:
                self.stats.cpu_hits += 1
            evicted = self._slots[slot]
            if evicted is not None:
                del self._slot_of[evicted]
                self.stats.gpu_evictions += 1
            self._slots[slot] = None  # a failed copy leaves the slot empty, never half-stale
            self._source.activate(slot, adapter_id, payload)
            self._slots[slot] = adapter_id
            self._slot_of[adapter_id] = slot
        self._in_use[adapter_id] += 1
        self._tick += 1
        self._slot_used_at[slot] = self._tick
        if adapter_id in self._cpu:
            self._cpu.move_to_end(adapter_id)
        return slot

    def release(self, adapter_id: AdapterId) -> None:
        if self._in_use[adapter_id] <= 0:
            raise RuntimeError("release() without acquire()")
        self._in_use[adapter_id] -= 1

    # -- the waiting queue and the reads -------------------------------------------------

    def plan(self, waiting: Sequence[AdapterId | None]) -> None:
        """Once per step, before admission: collect the reads that finished, note which
        adapters the waiting line needs (in line order), and start reads for the first ones
        that are only on disk (at most max_pending_loads in flight)."""
        self._errors = {}  # a failure is reported to one step's admission, then read again
        self.poll()
        self._wanted = {}
        for position, adapter_id in enumerate(waiting):
            if adapter_id is not None and adapter_id in self._known:
                self._wanted.setdefault(adapter_id, position)
        for adapter_id, position in sorted(self._wanted.items(), key=lambda kv: kv[1]):
            if len(self._pending) >= self._max_pending:
                break
            if (
                adapter_id in self._cpu
                or adapter_id in self._slot_of
                or adapter_id in self._pending
                or adapter_id in self._errors
            ):
                continue
            if not self._make_cpu_room(before=position):
                break  # everything in the CPU tier is needed sooner
            self._pending[adapter_id] = (self._source.start_load(adapter_id), self._clock())
            self.stats.num_prefetches += 1
        self.poll()  # reads that finished at once (a payload already at hand)

    def poll(self) -> None:
        """Move finished reads into the CPU tier (their room is reserved) or into errors."""
        for adapter_id, (future, started) in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[adapter_id]
            self.stats.num_loads += 1
            self.stats.load_seconds += self._clock() - started
            error = future.exception()
            if error is None:
                self._cpu[adapter_id] = future.result()
                self._fresh.add(adapter_id)
            elif isinstance(error, AdapterError):
                self._errors[adapter_id] = error
            else:
                raise error  # not the adapter's fault: a bug, out of memory; never swallowed

    def wait_for_load(self, timeout: float) -> None:
        """Block until a read in flight finishes or `timeout` passes: for a loop with nothing
        else to do (every waiting sequence waits for a read), instead of spinning."""
        if self._pending:
            wait([f for f, _ in self._pending.values()], timeout, return_when=FIRST_COMPLETED)

    # -- helpers -------------------------------------------------------------------------

    def _evictable_slot(self) -> int | None:
        best: tuple[int, int, int] | None = None
        best_slot = None
        for slot, adapter_id in enumerate(self._slots):
            if adapter_id is None:
                return slot
            if self._in_use[adapter_id]:
                continue
            position = self._wanted.get(adapter_id, _NOT_WANTED)
            key = (-position, self._slot_used_at[slot], slot)
            if best is None or key < best:
                best, best_slot = key, slot
        return best_slot

    def _cpu_victim(self, before: int) -> AdapterId | None:
        """The CPU entry to drop for something needed at line position `before`: unpinned,
        needed later than that, and preferably not wanted, not in a slot, least recent."""
        best: tuple[int, int, int] | None = None
        victim = None
        for lru_index, adapter_id in enumerate(self._cpu):
            if self._in_use[adapter_id]:
                continue
            position = self._wanted.get(adapter_id, _NOT_WANTED)
            if position < before or (position == before and before != _NOT_WANTED):
                continue
            key = (-position, int(adapter_id in self._slot_of), lru_index)
            if best is None or key < best:
                best, victim = key, adapter_id
        return victim

    def _make_cpu_room(self, *, before: int) -> bool:
        """Room for one more CPU entry (payload or read in flight), evicting if needed."""
        if len(self._cpu) + len(self._pending) < self.max_cpu_loras:
            return True
        victim = self._cpu_victim(before)
        if victim is None:
            return False
        del self._cpu[victim]
        self._fresh.discard(victim)
        self.stats.cpu_evictions += 1
        return True

    def _insert_cpu(self, adapter_id: AdapterId, payload: P, *, before: int) -> bool:
        if not self._make_cpu_room(before=before):
            return False
        self._cpu[adapter_id] = payload
        return True

    def check_invariants(self) -> None:
        assert len(self._cpu) + len(self._pending) <= self.max_cpu_loras, "CPU tier overfull"
        assert not self._pending.keys() & self._cpu.keys(), "a payload both read and pending"
        assert self._pending.keys() <= self._known, "a read in flight for an unknown adapter"
        assert self._fresh <= self._cpu.keys()
        assert len(self._slots) == self.max_loras
        assert len(self._slot_of) <= self.max_loras, "more adapters in slots than max_loras"
        for adapter_id, slot in self._slot_of.items():
            assert self._slots[slot] == adapter_id, "slot table out of sync"
        for adapter_id, count in self._in_use.items():
            assert count >= 0
            if count:
                assert adapter_id in self._slot_of, "an adapter in use lost its slot"
                assert adapter_id in self._known
