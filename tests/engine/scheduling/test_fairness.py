"""The virtual token counter's lift (the smallest active counter, from a lazy heap) against the
plain scan it replaced, over random arrivals, finishes and charges (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.scheduling.fairness import VirtualTokenCounter


class ScanCounter:
    """The definition: on becoming active, a tenant is lifted to the smallest active counter."""

    def __init__(self) -> None:
        self.served: dict[str, int] = {}
        self.active: Counter[str] = Counter()

    def on_arrival(self, tenant: str) -> None:
        if self.active[tenant] == 0:
            others = [self.served.get(t, 0) for t, n in self.active.items() if n > 0]
            lifted = max(self.served.get(tenant, 0), min(others)) if others else None
            self.served[tenant] = lifted if lifted is not None else self.served.get(tenant, 0)
        self.active[tenant] += 1

    def on_finish(self, tenant: str) -> None:
        self.active[tenant] -= 1

    def charge(self, tenant: str, num_tokens: int) -> None:
        self.served[tenant] = self.served.get(tenant, 0) + num_tokens


op_st = st.tuples(st.sampled_from(["arrive", "finish", "charge"]), st.integers(0, 5),
                  st.integers(0, 40))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op_st, max_size=120))
def test_lift_matches_the_scan(ops):
    vtc, scan = VirtualTokenCounter(), ScanCounter()
    for kind, t, num_tokens in ops:
        tenant = f"t{t}"
        if kind == "arrive":
            vtc.on_arrival(tenant)
            scan.on_arrival(tenant)
        elif kind == "finish" and scan.active[tenant] > 0:
            vtc.on_finish(tenant)
            scan.on_finish(tenant)
        elif kind == "charge" and scan.active[tenant] > 0:  # only running work is charged
            vtc.charge(tenant, num_tokens)
            scan.charge(tenant, num_tokens)
        vtc.check_invariants()
        assert {t: vtc.served(t) for t in scan.served} == scan.served


def test_an_arrival_that_rebuilds_the_heap_keeps_its_own_entry() -> None:
    """The heap is rebuilt from the active tenants when stale entries pile up. A tenant becoming
    active must already count as active when its entry goes in: rebuilt before that, the heap
    lost it, and once the tenant it tied with was charged the active minimum skipped it (found
    by the scheduler's reference test in CI, session 21). Every pile size is tried, so one of
    them puts the rebuild at the arrival."""
    for cycles in range(40):
        vtc = VirtualTokenCounter()
        vtc.on_arrival("heavy")
        vtc.charge("heavy", 5)
        for _ in range(cycles):  # stale entries above heavy's, never at the top
            vtc.on_arrival("other")
            vtc.charge("other", 100)
            vtc.on_finish("other")
        vtc.on_arrival("light")  # lifted to heavy's 5
        vtc.charge("heavy", 1)  # light alone holds the minimum now
        assert vtc.served("light") == 5
        vtc.check_invariants()
