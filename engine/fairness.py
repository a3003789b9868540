"""Fair sharing between tenants of equal priority: a virtual token counter (VTC).

Each tenant key has a counter of tokens served (prefill and decode alike). Among waiting
requests of equal priority the tenant with the smallest counter goes first. A tenant that
becomes active again is lifted to the smallest counter among active tenants, so idle time is
not banked as credit that would later starve the others (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024).
"""

from __future__ import annotations

from collections import Counter

# Forget idle tenants beyond this many keys; a forgotten tenant re-enters at the active minimum,
# which is what the lift would give it anyway unless it was ahead.
MAX_TRACKED_TENANTS = 10_000


class VirtualTokenCounter:
    def __init__(self) -> None:
        self._served: dict[str, int] = {}
        self._active: Counter[str] = Counter()  # tenant -> number of unfinished sequences

    def served(self, tenant: str) -> int:
        return self._served.get(tenant, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._served)

    def on_arrival(self, tenant: str) -> None:
        if self._active[tenant] == 0:
            others = [
                self._served.get(t, 0) for t, n in self._active.items() if n > 0 and t != tenant
            ]
            if others:
                self._served[tenant] = max(self._served.get(tenant, 0), min(others))
            else:
                self._served.setdefault(tenant, 0)
        self._active[tenant] += 1

    def on_finish(self, tenant: str) -> None:
        self._active[tenant] -= 1
        if self._active[tenant] <= 0:
            del self._active[tenant]
            if len(self._served) > MAX_TRACKED_TENANTS:
                self._forget_idle()

    def charge(self, tenant: str, num_tokens: int) -> None:
        self._served[tenant] = self._served.get(tenant, 0) + num_tokens

    def _forget_idle(self) -> None:
        for tenant in [t for t in self._served if t not in self._active]:
            del self._served[tenant]
