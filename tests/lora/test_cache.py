"""Acceptance 4 (the cache policy alone, no tensors): the slot tier never exceeds max_loras,
the CPU tier never exceeds max_cpu_loras, an adapter in use keeps its slot (and its weights in
it), eviction prefers what the waiting line does not need, prefetch reads ahead of admission."""

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
    assert cache.tier(A[0]) == "disk"
    assert cache.acquire(A[0]) == 0
    assert cache.tier(A[0]) == "gpu" and source.loads == [A[0]]
    assert cache.acquire(A[0]) == 0  # a second sequence: a slot hit
    assert not cache.can_acquire(A[1])  # the only slot is pinned
    cache.release(A[0])
    cache.release(A[0])
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
    for adapter_id in (A[0], A[1]):
        cache.acquire(adapter_id)
        cache.release(adapter_id)
    cache.plan([A[2], A[1], A[0]])
    cache.acquire(A[2])
    assert cache.tier(A[1]) == "gpu" and cache.tier(A[0]) == "cpu"


def test_prefetch_reads_the_next_needed_adapter_into_cpu():
    cache, source = make_cache(max_loras=1, max_cpu_loras=2)
    cache.acquire(A[0])  # pinned: A[1] cannot get a slot yet
    cache.plan([A[1], A[2]])
    assert cache.tier(A[1]) == "cpu" and source.loads == [A[0], A[1]]
    assert cache.stats.num_prefetches == 1  # one read per step
    cache.plan([A[1], A[2]])
    # The CPU tier is full (A[0] pinned, A[1] needed sooner): A[2] is not read.
    assert cache.tier(A[2]) == "disk"
    cache.release(A[0])
    cache.acquire(A[1])
    assert source.loads == [A[0], A[1]]  # the slot was filled from the prefetched payload


def test_prefetch_never_evicts_what_is_needed_sooner():
    cache, _ = make_cache(max_loras=1, max_cpu_loras=1)
    cache.acquire(A[0])
    cache.release(A[0])
    cache.plan([A[0], A[1]])
    assert cache.tier(A[0]) == "gpu" and cache.tier(A[1]) == "disk"


def test_unreadable_adapter_fails_acquire_and_leaves_the_cache_intact():
    cache, source = make_cache(max_loras=1, max_cpu_loras=1)
    cache.acquire(A[0])
    cache.release(A[0])
    source.unreadable.add(A[1])
    cache.plan([A[1]])  # a failed prefetch is not an error: admission reports it
    with pytest.raises(AdapterError):
        cache.acquire(A[1])
    assert cache.tier(A[0]) == "gpu" and cache.num_in_use(A[1]) == 0
    cache.check_invariants()


def test_unregister_in_use_is_refused_until_released():
    cache, _ = make_cache()
    cache.acquire(A[0])
    with pytest.raises(RuntimeError):
        cache.unregister(A[0])
    cache.release(A[0])
    cache.unregister(A[0])
    assert not cache.is_known(A[0]) and cache.tier(A[0]) == "disk"


class CacheMachine(RuleBasedStateMachine):
    """Random registers, acquires, releases, plans and unregisters over a small cache."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: AdapterCache[str] | None = None
        self.source = FakeSource()
        self.pins: dict[AdapterId, int] = {}  # adapter -> slot it was pinned in
        self.counts: dict[AdapterId, int] = {}
        self.known: set[AdapterId] = set()

    @precondition(lambda self: self.cache is None)
    @rule(max_loras=st.integers(1, 4), extra_cpu=st.integers(0, 4))
    def create(self, max_loras: int, extra_cpu: int) -> None:
        self.cache = AdapterCache(
            max_loras=max_loras, max_cpu_loras=max_loras + extra_cpu, source=self.source
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
        # With a slot free or unpinned, every known adapter can be served.
        if len(self.pins) < cache.max_loras:
            assert all(cache.can_acquire(a) for a in self.known)


CacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestCacheMachine = CacheMachine.TestCase
