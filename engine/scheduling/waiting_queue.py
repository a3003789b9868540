"""The waiting line as an index: priority bands, tenants inside a band, arrival inside a tenant.

Order (policy `priority`; `fcfs` puts every sequence in one band and one tenant, which leaves
arrival order):

- Between bands (a band = the waiting sequences of one priority value): the band whose oldest
  sequence has the smallest deadline `priority * aging_steps + arrival_step` goes first, ties to
  the older head. A sequence's aged level `priority - steps_waited // aging_steps` equals
  `ceil((deadline - now) / aging_steps)`, so this orders bands by their oldest sequence's aged
  level (bands of one level by deadline), and it never changes as steps pass: only a band's
  oldest sequence moves its place.
- Inside a band: the tenant served the fewest tokens (the fair-share counter,
  engine/scheduling/fairness.py) goes first, ties to the tenant whose oldest sequence in the
  band arrived first. Aging never reorders tenants inside a band.
- Inside a tenant's part of a band: arrival order (`arrival_order`, then `seq_id`).

The line is the sequence of successive choices: take the best, remove it, choose again. Taking
a band's oldest sequence can move that band behind another, so the line is produced by `pop`,
one sequence at a time, never sorted as a whole.

Layout (every heap is lazy: an entry whose generation or version is not current is stale and is
dropped when it reaches the top; a heap more than half stale is rebuilt):

    _band_heap          (deadline, head arrival_order, head seq_id, version, priority)
    _Band.tenant_heap   (served, head arrival_order, head seq_id, version, tenant)
    _Band.oldest        (arrival_order, seq_id, generation, seq)   every sequence of the band
    _TenantLine.heap    (arrival_order, seq_id, generation, seq)   one tenant's, in one band

A band's oldest sequence (by arrival_order) is also its earliest arrival_step: both are taken
at arrival, and a preempted sequence keeps both.

A band's or a tenant line's current entry (the one of its current version) holds a lower bound
of its key, not always the key: a key only grows between pushes (taking a line's oldest moves
its head later, and so its band's deadline; a charge raises the tenant's counter, and the
counter of a tenant with waiting sequences changes only when it is charged:
engine/scheduling/fairness.py lifts only idle tenants), so a key that grows is not pushed again;
when its entry reaches the top it is corrected in place (`heapreplace`) before it is believed.
An entry is pushed only when a key shrinks (an older sequence arrives or comes back). Every
entry below the top is then at most its line's true key, so a corrected top is the true minimum.
Passing over a sequence (taken and put back) costs its line one push, and a charge none: the
line reads the counters through `served` when it needs them, and nobody has to report a change.

So `add`, `remove` and `pop` cost O(log n) amortized and `peek` O(1) amortized.

Invariant (check_invariants): each band's and each tenant line's current entry names its true
oldest sequence or an older one, and its tenant's counter or a smaller one; counts match the
members; every member is in exactly its own band and line.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from engine.scheduling.sequence import Sequence

_SeqEntry = tuple[int, int, int, Sequence]  # (arrival_order, seq_id, generation, seq)
_TenantEntry = tuple[int, int, int, int, str]
_BandEntry = tuple[int, int, int, int, int]
_SLACK = 16  # stale entries tolerated on top of the live ones before a heap is rebuilt


@dataclass
class _TenantLine:
    tenant: str
    heap: list[_SeqEntry] = field(default_factory=list)
    num_seqs: int = 0
    head: tuple[int, int] | None = None  # (arrival_order, seq_id) its current entry names
    version: int = -1


@dataclass
class _Band:
    priority: int
    tenants: dict[str, _TenantLine] = field(default_factory=dict)
    tenant_heap: list[_TenantEntry] = field(default_factory=list)
    oldest: list[_SeqEntry] = field(default_factory=list)
    num_seqs: int = 0
    head: tuple[int, int] | None = None
    deadline: int = 0  # of the head: priority * aging_steps + its arrival_step
    version: int = -1


class WaitingQueue:
    def __init__(self, *, aging_steps: int, served: Callable[[str], int], by_priority: bool = True):
        self._aging_steps = aging_steps
        # fcfs: one tenant key for every sequence, whose entry must not move when charged.
        self._served = served if by_priority else (lambda _tenant: 0)
        self._by_priority = by_priority
        self._members: dict[Sequence, int] = {}  # seq -> generation of its live entries
        self._bands: dict[int, _Band] = {}
        self._band_heap: list[_BandEntry] = []
        self._num_by_adapter: Counter[int] = Counter()
        self._num_base = 0  # sequences on the base model (no adapter)
        self._counter = itertools.count()

    # -- queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __contains__(self, seq: object) -> bool:
        return seq in self._members

    def __iter__(self) -> Iterator[Sequence]:
        """Every waiting sequence, in no particular order (`pop` gives the line's order)."""
        return iter(list(self._members))

    def adapters(self) -> list[int]:
        """The adapters some waiting sequence needs, in increasing id order."""
        return sorted(self._num_by_adapter)

    def num_with_adapter(self, adapter_id: int | None) -> int:
        """How many waiting sequences use this adapter (None: the base model)."""
        if adapter_id is None:
            return self._num_base
        return self._num_by_adapter.get(adapter_id, 0)

    def peek(self) -> Sequence | None:
        band = self._top_band()
        if band is None:
            return None
        return self._head(self._top_line(band).heap)

    def best_level(self, now: int) -> int | None:
        """The best (smallest) aged level of any waiting sequence: the first band's oldest."""
        band = self._top_band()
        if band is None:
            return None
        deadline = self._band_heap[0][0]
        return -((now - deadline) // self._aging_steps)

    # -- mutations -----------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        assert seq not in self._members, "a sequence is already waiting"
        gen = next(self._counter)
        self._members[seq] = gen
        priority, tenant = self._keys(seq)
        band = self._bands.get(priority)
        if band is None:
            band = self._bands[priority] = _Band(priority)
        line = band.tenants.get(tenant)
        if line is None:
            line = band.tenants[tenant] = _TenantLine(tenant)
        key = (seq.arrival_order, seq.seq_id)
        entry = (*key, gen, seq)
        heapq.heappush(line.heap, entry)
        heapq.heappush(band.oldest, entry)
        line.num_seqs += 1
        band.num_seqs += 1
        if seq.adapter_id is not None:
            self._num_by_adapter[seq.adapter_id] += 1
        else:
            self._num_base += 1
        if line.head is None or key < line.head:
            self._push_line(band, tenant, line, key)
        if band.head is None or key < band.head:
            self._push_band(band, key, seq.arrival_step)

    def remove(self, seq: Sequence) -> None:
        priority, tenant = self._keys(seq)
        band = self._bands[priority]
        self._remove(seq, band, tenant, band.tenants[tenant])

    def pop(self) -> Sequence | None:
        """Remove and return the first sequence of the line."""
        band = self._top_band()
        if band is None:
            return None
        line = self._top_line(band)
        seq = self._head(line.heap)
        self._remove(seq, band, line.tenant, line)
        return seq

    # -- helpers -------------------------------------------------------------------------

    def _keys(self, seq: Sequence) -> tuple[int, str]:
        if self._by_priority:
            return seq.priority, seq.tenant_key
        return 0, ""

    def _head(self, heap: list[_SeqEntry]) -> Sequence:
        members = self._members
        while members.get(heap[0][3]) != heap[0][2]:
            heapq.heappop(heap)
        return heap[0][3]

    def _top_band(self) -> _Band | None:
        heap = self._band_heap
        while heap:
            top = heap[0]
            band = self._bands.get(top[4])
            if band is None or band.version != top[3]:
                heapq.heappop(heap)
            elif top[0] == band.deadline and (top[1], top[2]) == band.head:
                return band
            else:  # a lower bound: its head moved on since it was pushed
                assert band.head is not None
                heapq.heapreplace(heap, (band.deadline, *band.head, band.version, band.priority))
        return None

    def _top_line(self, band: _Band) -> _TenantLine:
        heap = band.tenant_heap
        while True:
            top = heap[0]
            line = band.tenants.get(top[4])
            if line is None or line.version != top[3]:
                heapq.heappop(heap)
                continue
            served = self._served(line.tenant)
            if top[0] == served and (top[1], top[2]) == line.head:
                return line
            # a lower bound: the tenant was charged, or its head moved on, since it was pushed
            assert line.head is not None
            heapq.heapreplace(heap, (served, *line.head, line.version, line.tenant))

    def _remove(self, seq: Sequence, band: _Band, tenant: str, line: _TenantLine) -> None:
        del self._members[seq]
        if seq.adapter_id is not None:
            self._num_by_adapter[seq.adapter_id] -= 1
            if not self._num_by_adapter[seq.adapter_id]:
                del self._num_by_adapter[seq.adapter_id]
        else:
            self._num_base -= 1
        key = (seq.arrival_order, seq.seq_id)
        line.num_seqs -= 1
        if line.num_seqs == 0:
            del band.tenants[tenant]
        else:
            if len(line.heap) > 2 * line.num_seqs + _SLACK:  # the test inline: every pop asks
                self._compact(line.heap)
            if key == line.head:  # the key grows: its entry stays, a lower bound
                head = self._head(line.heap)
                line.head = (head.arrival_order, head.seq_id)
        band.num_seqs -= 1
        if band.num_seqs == 0:
            del self._bands[band.priority]
            return
        if len(band.oldest) > 2 * band.num_seqs + _SLACK:
            self._compact(band.oldest)
        if key == band.head:  # as for the line: a later head, a later deadline
            head = self._head(band.oldest)
            band.head = (head.arrival_order, head.seq_id)
            band.deadline = band.priority * self._aging_steps + head.arrival_step

    def _push_line(
        self, band: _Band, tenant: str, line: _TenantLine, head: tuple[int, int]
    ) -> None:
        line.head = head
        line.version = next(self._counter)
        entry = (self._served(tenant), *head, line.version, tenant)
        heapq.heappush(band.tenant_heap, entry)
        if len(band.tenant_heap) > 2 * len(band.tenants) + _SLACK:
            band.tenant_heap = [
                e for e in band.tenant_heap
                if (t := band.tenants.get(e[4])) is not None and t.version == e[3]
            ]  # fmt: skip
            heapq.heapify(band.tenant_heap)

    def _push_band(self, band: _Band, head: tuple[int, int], arrival_step: int) -> None:
        band.head = head
        band.version = next(self._counter)
        band.deadline = band.priority * self._aging_steps + arrival_step
        heapq.heappush(self._band_heap, (band.deadline, *head, band.version, band.priority))
        if len(self._band_heap) > 2 * len(self._bands) + _SLACK:
            self._band_heap = [e for e in self._band_heap if self._is_live_band(e)]
            heapq.heapify(self._band_heap)

    def _is_live_band(self, entry: _BandEntry) -> bool:
        band = self._bands.get(entry[4])
        return band is not None and band.version == entry[3]

    def _compact(self, heap: list[_SeqEntry]) -> None:
        members = self._members
        heap[:] = [e for e in heap if members.get(e[3]) == e[2]]
        heapq.heapify(heap)

    def check_invariants(self) -> None:
        num_seqs = 0
        live_bands = 0
        for priority, band in self._bands.items():
            seqs = [e[3] for e in band.oldest if self._members.get(e[3]) == e[2]]
            assert band.num_seqs == len(seqs) > 0, f"band {priority}: count mismatch"
            oldest = min(seqs, key=lambda s: (s.arrival_order, s.seq_id))
            assert band.head == (oldest.arrival_order, oldest.seq_id), "stale band head"
            assert band.deadline == priority * self._aging_steps + oldest.arrival_step
            current = [e for e in self._band_heap if e[4] == priority and self._is_live_band(e)]
            assert len(current) == 1 and current[0][:3] <= (band.deadline, *band.head), (
                f"band {priority}: its entry is not a lower bound of its key"
            )
            live_bands += 1
            for tenant, line in band.tenants.items():
                mine = [e[3] for e in line.heap if self._members.get(e[3]) == e[2]]
                assert line.num_seqs == len(mine) > 0, f"tenant line {tenant!r}: count mismatch"
                for seq in mine:
                    assert self._keys(seq) == (priority, tenant), "sequence in the wrong line"
                head = min(mine, key=lambda s: (s.arrival_order, s.seq_id))
                assert line.head == (head.arrival_order, head.seq_id), "stale tenant head"
                mine_now = [e for e in band.tenant_heap if e[4] == tenant and e[3] == line.version]
                key = (self._served(tenant), *line.head)
                assert len(mine_now) == 1 and mine_now[0][:3] <= key, (
                    f"tenant {tenant!r}: its entry is not a lower bound of its key"
                )
                num_seqs += len(mine)
        assert num_seqs == len(self._members), "members outside every band"
        assert live_bands == sum(1 for e in self._band_heap if self._is_live_band(e))
        by_arrival = sorted(self._members, key=lambda s: (s.arrival_order, s.seq_id))
        steps = [s.arrival_step for s in by_arrival]
        assert steps == sorted(steps), "arrival_step decreases as arrival_order grows"
        adapters = Counter(s.adapter_id for s in self._members if s.adapter_id is not None)
        assert adapters == self._num_by_adapter, "adapter counts out of sync"
        assert self._num_base == len(self._members) - adapters.total(), "base count out of sync"
