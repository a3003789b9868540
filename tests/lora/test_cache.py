"""Acceptance 4 (the cache policy alone, no tensors): the slot tier never exceeds max_loras,
the CPU tier never exceeds max_cpu_loras, an adapter in use keeps its slot (and its weights in
it), eviction prefers what the waiting line does not need, reads start ahead of admission in
line order, and an adapter whose read is in flight cannot be acquired (issue 14: reads run off
the engine loop). The CPU-tier bound counts reads in flight."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lora.cache import AdapterCache
from lora.errors import AdapterError
from lora.registry import AdapterId
from tests.lora.fake_source import FakeSource

A = [AdapterId(i) for i in range(1, 13)]


def make_cache(max_loras: int = 2, max_cpu_loras: int = 3, num_adapters: int = 6):
    source = FakeSource()
    cache: AdapterCache[str] = AdapterCache(
        max_loras=max_loras, max_cpu_loras=max_cpu_loras, source=source
    )
    for adapter_id in A[:num_adapters]:
        cache.register(adapter_id)
    return cache, source


def test_max_cpu_loras_below_max_loras_is_refused():
    with pytest.raises(ValueError, match="max_cpu_loras"):
        AdapterCache(max_loras=4, max_cpu_loras=3, source=FakeSource())


def test_tiers_and_counters_through_a_swap():
    cache, source = make_cache(max_loras=1, max_cpu_loras=2)
    assert cache.tier(A[0]) == "disk" and not cache.can_acquire(A[0])
    cache.plan([A[0]])  # the line needs it: its read starts (and, here, finishes at once)
    assert cache.tier(A[0]) == "cpu"
    assert cache.acquire(A[0]) == 0
    assert cache.tier(A[0]) == "gpu" and source.loads == [A[0]]
    assert cache.acquire(A[0]) == 0  # a second sequence: a slot hit
    assert not cache.can_acquire(A[1])  # the only slot is pinned
    cache.release(A[0])
    cache.release(A[0])
    cache.plan([A[1]])
    cache.acquire(A[1])
    assert cache.tier(A[0]) == "cpu" and cache.tier(A[1]) == "gpu"
    cache.release(A[1])
    cache.acquire(A[0])  # back from the CPU tier, no disk read
    assert source.loads == [A[0], A[1]]
    s = cache.stats
    assert (s.gpu_hits, s.gpu_misses, s.cpu_hits, s.cpu_misses) == (1, 3, 1, 2)
    assert s.gpu_evictions == 2 and s.num_loads == 2


def test_slot_eviction_prefers_what_no_waiting_request_needs():
    cache, _ = make_cache(max_loras=2, max_cpu_loras=4)
    cache.plan([A[0], A[1]])
    cache.acquire(A[0])
    cache.acquire(A[1])
    cache.release(A[0])
    cache.release(A[1])
    # A[0] is the least recently used, but the waiting line needs it: A[1] goes instead.
    cache.plan([A[2], A[0]])
    cache.acquire(A[2])
    assert cache.tier(A[0]) == "gpu" and cache.tier(A[1]) == "cpu"


def test_slot_eviction_among_wanted_takes_the_one_needed_last():
    cache, _ = make_cache(max_loras=2, max_cpu_loras=4)
    cache.plan([A[0], A[1]])
    for adapter_id in (A[0], A[1]):
        cache.acquire(adapter_id)
        cache.release(adapter_id)
    cache.plan([A[2], A[1], A[0]])
    cache.acquire(A[2])
    assert cache.tier(A[1]) == "gpu" and cache.tier(A[0]) == "cpu"


def test_prefetch_reads_the_next_needed_adapter_into_cpu():
    cache, source = make_cache(max_loras=1, max_cpu_loras=2)
    cache.plan([A[0]])
    cache.acquire(A[0])  # pinned: A[1] cannot get a slot yet
    cache.plan([A[1], A[2]])
    assert cache.tier(A[1]) == "cpu" and source.loads == [A[0], A[1]]
    # The CPU tier is full (A[0] pinned, A[1] needed sooner): A[2] is not read.
    assert cache.tier(A[2]) == "disk" and cache.stats.num_prefetches == 2
    cache.plan([A[1], A[2]])
    assert cache.tier(A[2]) == "disk"
    cache.release(A[0])
    cache.acquire(A[1])
    assert source.loads == [A[0], A[1]]  # the slot was filled from the prefetched payload


def test_prefetch_never_evicts_what_is_needed_sooner():
    cache, _ = make_cache(max_loras=1, max_cpu_loras=1)
    cache.plan([A[0]])
    cache.acquire(A[0])
    cache.release(A[0])
    cache.plan([A[0], A[1]])
    assert cache.tier(A[0]) == "gpu" and cache.tier(A[1]) == "disk"


def test_unreadable_adapter_reports_its_error_for_one_step_and_leaves_the_cache_intact():
    cache, source = make_cache(max_loras=1, max_cpu_loras=1)
    cache.plan([A[0]])
    cache.acquire(A[0])
    cache.release(A[0])
    source.unreadable.add(A[1])
    cache.plan([A[1]])
    assert isinstance(cache.load_error(A[1]), AdapterError)  # admission fails its requests
    assert not cache.can_acquire(A[1]) and cache.num_in_use(A[1]) == 0
    assert cache.tier(A[0]) == "gpu" and cache.tier(A[1]) == "disk"
    cache.check_invariants()
    source.unreadable.clear()
    cache.plan([A[1]])  # the next step's line reads it again
    assert cache.load_error(A[1]) is None and cache.tier(A[1]) == "cpu"
    assert source.loads == [A[0], A[1], A[1]]
    cache.check_invariants()


def test_a_read_in_flight_is_not_acquirable_until_a_plan_collects_it():
    source = FakeSource(hold_loads=True)
    cache: AdapterCache[str] = AdapterCache(max_loras=2, max_cpu_loras=2, source=source)
    cache.register(A[0])
    cache.plan([A[0]])
    assert cache.is_loading(A[0]) and cache.tier(A[0]) == "disk"
    assert cache.can_get_slot(A[0]) and not cache.can_acquire(A[0])
    with pytest.raises(RuntimeError):
        cache.acquire(A[0])
    cache.plan([A[0]])  # still in flight: not read a second time
    assert source.loads == [A[0]]
    source.complete(A[0])  # the worker finished; the loop has not looked yet
    assert not cache.can_acquire(A[0])
    cache.plan([A[0]])
    assert cache.tier(A[0]) == "cpu" and cache.can_acquire(A[0])
    assert cache.acquire(A[0]) == 0
    assert (cache.stats.num_loads, cache.stats.cpu_misses, cache.stats.cpu_hits) == (1, 1, 0)
    cache.check_invariants()


def test_reads_in_flight_hold_their_cpu_room_and_their_number_is_bounded():
    source = FakeSource(hold_loads=True)
    cache: AdapterCache[str] = AdapterCache(
        max_loras=1, max_cpu_loras=3, source=source, max_pending_loads=2
    )
    for adapter_id in A[:6]:
        cache.register(adapter_id)
    cache.plan(A[:5])
    assert source.loads == [A[0], A[1]]  # two in flight at most, first needed first
    cache.check_invariants()
    source.complete_all()
    cache.plan(A[:5])
    assert source.loads == [A[0], A[1], A[2]]  # A[0], A[1] read; one CPU entry left
    cache.check_invariants()
    cache.register(A[5], f"payload-{A[5]}")  # no room: A[0..1] are wanted, A[2] in flight
    assert cache.tier(A[5]) == "disk"
    cache.check_invariants()


def test_unregister_drops_a_read_in_flight():
    source = FakeSource(hold_loads=True)
    cache: AdapterCache[str] = AdapterCache(max_loras=1, max_cpu_loras=1, source=source)
    cache.register(A[0])
    cache.plan([A[0]])
    cache.unregister(A[0])
    source.complete_all()
    cache.plan([A[0]])
    assert cache.num_cpu == 0 and cache.num_pending_loads == 0
    cache.check_invariants()


def test_unregister_in_use_is_refused_until_released():
    cache, _ = make_cache()
    cache.plan([A[0]])
    cache.acquire(A[0])
    with pytest.raises(RuntimeError):
        cache.unregister(A[0])
    cache.release(A[0])
    cache.unregister(A[0])
    assert not cache.is_known(A[0]) and cache.tier(A[0]) == "disk"


class CacheMachine(RuleBasedStateMachine):
    """Random registers, acquires, releases, plans, unregisters and (with reads held in
    flight) read completions over a small cache; one adapter cannot be read."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: AdapterCache[str] | None = None
        self.source = FakeSource()
        self.pins: dict[AdapterId, int] = {}  # adapter -> slot it was pinned in
        self.counts: dict[AdapterId, int] = {}
        self.known: set[AdapterId] = set()

    @precondition(lambda self: self.cache is None)
    @rule(
        max_loras=st.integers(1, 4),
        extra_cpu=st.integers(0, 4),
        hold_loads=st.booleans(),
        max_pending=st.integers(1, 3),
    )
    def create(self, max_loras: int, extra_cpu: int, hold_loads: bool, max_pending: int) -> None:
        self.source.hold_loads = hold_loads
        self.source.unreadable = {A[-1]}
        self.cache = AdapterCache(
            max_loras=max_loras,
            max_cpu_loras=max_loras + extra_cpu,
            source=self.source,
            max_pending_loads=max_pending,
        )

    @precondition(lambda self: self.cache is not None)
    @rule(adapter=st.sampled_from(A), with_payload=st.booleans())
    def register(self, adapter: AdapterId, with_payload: bool) -> None:
        assert self.cache is not None
        self.cache.register(adapter, f"payload-{adapter}" if with_payload else None)
        self.known.add(adapter)

    @precondition(lambda self: self.cache is not None)
    @rule(adapter=st.sampled_from(A))
    def acquire(self, adapter: AdapterId) -> None:
        assert self.cache is not None
        if adapter not in self.known or not self.cache.can_acquire(adapter):
            return
        assert not self.cache.is_loading(adapter) and self.cache.load_error(adapter) is None
        slot = self.cache.acquire(adapter)
        assert self.pins.setdefault(adapter, slot) == slot
        self.counts[adapter] = self.counts.get(adapter, 0) + 1

    @precondition(lambda self: bool(self.counts))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        assert self.cache is not None
        adapter = data.draw(st.sampled_from(sorted(self.counts)))
        self.cache.release(adapter)
        self.counts[adapter] -= 1
        if not self.counts[adapter]:
            del self.counts[adapter], self.pins[adapter]

    @precondition(lambda self: self.cache is not None)
    @rule(waiting=st.lists(st.one_of(st.none(), st.sampled_from(A)), max_size=8))
    def plan(self, waiting: list[AdapterId | None]) -> None:
        assert self.cache is not None
        self.cache.plan(waiting)

    @precondition(lambda self: bool(self.source.pending))
    @rule(data=st.data())
    def finish_a_read(self, data: st.DataObject) -> None:
        self.source.complete(data.draw(st.sampled_from(sorted(self.source.pending))))

    @precondition(lambda self: self.cache is not None)
    @rule()
    def poll(self) -> None:
        assert self.cache is not None
        self.cache.poll()

    @precondition(lambda self: self.cache is not None)
    @rule(adapter=st.sampled_from(A))
    def unregister(self, adapter: AdapterId) -> None:
        assert self.cache is not None
        if adapter in self.counts:
            with pytest.raises(RuntimeError):
                self.cache.unregister(adapter)  # in use: refused, nothing changes
            return
        self.cache.unregister(adapter)
        self.known.discard(adapter)

    @precondition(lambda self: self.cache is not None)
    @rule(adapter=st.sampled_from(A))
    def begin_unregister(self, adapter: AdapterId) -> None:
        assert self.cache is not None
        self.cache.begin_unregister(adapter)

    @precondition(lambda self: self.cache is not None)
    @rule(waiting=st.sets(st.sampled_from(A), max_size=4))
    def finish_unregisters(self, waiting: set[AdapterId]) -> None:
        """`waiting`: adapters that waiting (not yet running) sequences still need."""
        assert self.cache is not None
        live = waiting | set(self.counts)
        removed = self.cache.finish_unregisters(live)
        assert not set(removed) & live, "an adapter in use was unloaded"
        self.known -= set(removed)
        for adapter in removed:
            assert self.cache.tier(adapter) == "disk" and not self.cache.is_known(adapter)

    @invariant()
    def tiers_are_bounded_and_pins_hold(self) -> None:
        cache = self.cache
        if cache is None:
            return
        cache.check_invariants()
        assert cache.num_occupied_slots <= cache.max_loras
        assert cache.num_cpu <= cache.max_cpu_loras
        for adapter, slot in self.pins.items():
            # In use: still in the slot it was pinned in, and the slot still holds its weights.
            assert cache.slot_of(adapter) == slot
            assert self.source.slot_contents[slot] == adapter
        # With a slot free or unpinned, every known adapter can get one, and every adapter
        # read into the CPU tier can be served now.
        if len(self.pins) < cache.max_loras:
            assert all(cache.can_get_slot(a) for a in self.known)
            assert all(cache.can_acquire(a) for a in self.known if cache.tier(a) != "disk")


CacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestCacheMachine = CacheMachine.TestCase
