"""Fair sharing between tenants of equal priority: a virtual token counter (VTC).

Each tenant key has a counter of tokens served (prefill and decode alike). Among waiting
requests of equal priority the tenant with the smallest counter goes first. A tenant that
becomes active again (its first unfinished sequence arrives) is lifted to the smallest counter
among the other active tenants, never lowered, and keeps its own when none is active: idle time
is not banked as credit that would later starve the others (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024). Only that lift moves a counter other than a charge, and it
applies to a tenant with no unfinished request (the waiting line relies on this).

The smallest active counter comes from a lazy min-heap of (counter, tenant): an entry is stale
once its tenant is idle or charged again, and dropped when it reaches the top; the heap is
rebuilt when more than half of it is stale. Arrivals, finishes and charges cost O(log tenants).
"""

from __future__ import annotations

import heapq
from collections import Counter

# Forget idle tenants beyond this many keys; a forgotten tenant re-enters at the active minimum,
# which is what the lift would give it anyway unless it was ahead.
MAX_TRACKED_TENANTS = 10_000


class VirtualTokenCounter:
    def __init__(self) -> None:
        self._served: dict[str, int] = {}
        self._active: Counter[str] = Counter()  # tenant -> number of unfinished sequences
        self._active_heap: list[tuple[int, str]] = []  # (served, tenant), lazy

    def served(self, tenant: str) -> int:
        return self._served.get(tenant, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._served)

    def on_arrival(self, tenant: str) -> None:
        becomes_active = self._active[tenant] == 0
        if becomes_active:
            lowest = self._min_active()
            if lowest is not None:
                self._served[tenant] = max(self._served.get(tenant, 0), lowest)
            else:
                self._served.setdefault(tenant, 0)
        self._active[tenant] += 1
        # after the count: a push may rebuild the heap from the active tenants, this one included
        if becomes_active:
            self._push(tenant)

    def on_finish(self, tenant: str) -> None:
        self._active[tenant] -= 1
        if self._active[tenant] <= 0:
            del self._active[tenant]
            if len(self._served) > MAX_TRACKED_TENANTS + len(self._active):
                self._forget_idle()

    def charge(self, tenant: str, num_tokens: int) -> None:
        self._served[tenant] = self._served.get(tenant, 0) + num_tokens
        if self._active[tenant] > 0:
            self._push(tenant)

    def _push(self, tenant: str) -> None:
        heapq.heappush(self._active_heap, (self._served[tenant], tenant))
        if len(self._active_heap) > 2 * len(self._active) + 16:
            self._active_heap = [(self._served[t], t) for t in self._active]
            heapq.heapify(self._active_heap)

    def _min_active(self) -> int | None:
        heap = self._active_heap
        while heap:
            served, tenant = heap[0]
            if self._active[tenant] > 0 and self._served.get(tenant) == served:
                return served
            heapq.heappop(heap)
        return None

    def _forget_idle(self) -> None:
        for tenant in [t for t in self._served if t not in self._active]:
            del self._served[tenant]

    def check_invariants(self) -> None:
        lowest = min((self._served.get(t, 0) for t in self._active), default=None)
        assert self._min_active() == lowest, "the active minimum is out of date"
