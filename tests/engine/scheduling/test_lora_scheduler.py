"""The scheduler with adapter slots (no model): a batch never holds more distinct adapters than
max_loras, a request whose adapter gets no slot waits without holding up others and within the
aging bound, every request is eventually served (hypothesis, with disk reads finishing at once
or held in flight for a few steps), a request whose adapter is still being read is passed over
while the others run, an unreadable adapter fails only its own requests."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.outputs import FinishReason, SchedulerOutput
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from lora.cache import AdapterCache
from lora.registry import AdapterId
from tests.engine.scheduling.sched_sim import Sim
from tests.lora.fake_source import FakeSource


def lora_sim(
    *,
    max_loras: int,
    max_cpu_loras: int | None = None,
    num_adapters: int = 8,
    num_blocks: int = 1024,
    block_size: int = 4,
    hold_loads: bool = False,
    **config: object,
) -> tuple[Sim, AdapterCache[str], FakeSource]:
    cpu = max_cpu_loras if max_cpu_loras is not None else max_loras
    engine_config = EngineConfig(
        model="unused",
        block_size=block_size,
        max_loras=max_loras,
        max_cpu_loras=cpu,
        **config,  # type: ignore[arg-type]
    )
    source = FakeSource(hold_loads=hold_loads)
    cache: AdapterCache[str] = AdapterCache(max_loras=max_loras, max_cpu_loras=cpu, source=source)
    for i in range(1, num_adapters + 1):
        cache.register(AdapterId(i))
    scheduler = Scheduler(engine_config, BlockManager(num_blocks, block_size), cache)
    return Sim(scheduler), cache, source


def distinct_adapters(out: SchedulerOutput) -> set[int]:
    return {s.seq.adapter_id for s in out.scheduled if s.seq.adapter_id is not None}


def run_checked(sim: Sim, cache: AdapterCache[str], max_steps: int = 5000) -> int:
    for step in range(max_steps):
        if not sim.scheduler.num_unfinished:
            return step
        out = sim.step()
        assert len(distinct_adapters(out)) <= cache.max_loras
        cache.check_invariants()
        running = {s.adapter_id for s in sim.scheduler.running if s.adapter_id is not None}
        assert all(cache.slot_of(AdapterId(a)) is not None for a in running)
    raise AssertionError("did not finish")


def test_batch_never_holds_more_adapters_than_slots():
    sim, cache, _ = lora_sim(max_loras=2, max_cpu_loras=3)
    for i in range(24):
        sim.add(f"r{i}", 6, max_tokens=3 + i % 4, adapter_id=1 + i % 6)
    for i in range(6):
        sim.add(f"base{i}", 6, max_tokens=3)
    run_checked(sim, cache)
    assert len(sim.finished) == 30
    assert cache.stats.gpu_evictions > 0 and cache.num_pinned_slots == 0


def test_blocked_adapter_does_not_hold_up_others_and_gets_the_next_free_slot():
    sim, _, _ = lora_sim(max_loras=1)
    sim.add("a0", 4, max_tokens=6, adapter_id=1)
    sim.step()  # a0 runs and pins the only slot
    sim.add("b", 4, max_tokens=2, adapter_id=2)  # no slot for adapter 2
    sim.add("base", 4, max_tokens=2)  # behind b in line, no adapter
    sim.add("a1", 4, max_tokens=2, adapter_id=1)  # behind b, would pin adapter 1 again
    out = sim.step()
    names = {s.seq.request.request_id for s in out.scheduled}
    assert "base" in names, "the base request behind the blocked one must run"
    assert "b" not in names and "a1" not in names, "a1 must not re-pin the slot b waits for"
    sim.run()
    order = sim.finish_order()
    assert order.index("b") < order.index("a1")


def test_slot_held_for_a_waiting_adapter_is_not_retaken_by_later_requests():
    sim, _, _ = lora_sim(max_loras=1)
    sim.add("a0", 4, max_tokens=4, adapter_id=1)
    sim.step()
    sim.add("b", 4, max_tokens=1, adapter_id=2)
    for step in range(20):  # a steady stream for adapter 1 arriving after b
        sim.add(f"a{step + 1}", 4, max_tokens=4, adapter_id=1)
        sim.step()
        if "b" in sim.finish_step:
            break
    assert "b" in sim.finish_step and sim.finish_step["b"] <= 8


def test_aging_bounds_the_wait_of_a_request_whose_adapter_has_no_slot():
    aging_steps, priority = 4, 6
    sim, _, _ = lora_sim(max_loras=1, aging_steps=aging_steps, max_num_seqs=4)
    sim.add("old", 4, max_tokens=2, priority=priority, adapter_id=2)
    for step in range(400):
        sim.add(f"s{step}a", 4, max_tokens=2, adapter_id=1)
        sim.add(f"s{step}b", 4, max_tokens=2, adapter_id=1)
        sim.step()
        if "old" in sim.finish_step:
            break
    newcomer_bound = (priority + 1) * aging_steps
    assert "old" in sim.finish_step
    assert sim.finish_step["old"] <= 3 * newcomer_bound + 4


def test_unreadable_adapter_fails_its_request_only():
    sim, _, source = lora_sim(max_loras=2)
    source.unreadable.add(AdapterId(3))
    sim.add("ok", 4, max_tokens=2, adapter_id=1)
    bad = sim.add("bad", 4, max_tokens=2, adapter_id=3)
    out = sim.step()
    assert [f.seq for f in out.failed] == [bad]
    assert bad.finish_reason is FinishReason.ERROR and "vanished" in out.failed[0].message
    sim.run()
    assert sim.finish_order() == ["ok"]
    assert sim.block_manager.num_free_blocks == sim.block_manager.num_blocks


def test_a_request_whose_adapter_is_being_read_is_passed_over_while_others_run():
    sim, cache, source = lora_sim(max_loras=2, hold_loads=True)
    sim.add("slow", 4, max_tokens=2, adapter_id=1)  # first in line; its read is held
    sim.add("base", 4, max_tokens=10)
    for _ in range(4):
        out = sim.step()
        cache.check_invariants()
        sim.scheduler.check_invariants()
        assert [s.seq.request.request_id for s in out.scheduled] == ["base"]
        assert cache.is_loading(AdapterId(1))
    assert source.loads == [AdapterId(1)], "one read, never repeated while in flight"
    source.complete_all()
    sim.run()
    assert sim.first_token_step["base"] == 1 and sim.first_token_step["slow"] > 4
    assert set(sim.finish_order()) == {"base", "slow"}
    assert cache.stats.cpu_misses == 1 and cache.num_pinned_slots == 0


def test_a_failed_read_fails_every_request_waiting_for_it_and_only_those():
    sim, cache, source = lora_sim(max_loras=2, hold_loads=True)
    source.unreadable.add(AdapterId(3))
    bad = [sim.add(f"bad{i}", 4, max_tokens=2, adapter_id=3) for i in range(2)]
    sim.add("ok", 4, max_tokens=2, adapter_id=1)
    assert not sim.step().failed  # the reads are in flight
    source.complete_all()
    out = sim.step()
    assert sorted(f.seq.seq_id for f in out.failed) == sorted(s.seq_id for s in bad)
    assert all("vanished" in f.message for f in out.failed)
    source.complete_all()
    sim.run()
    assert sim.finish_order() == ["ok"]
    cache.check_invariants()


def test_preemption_releases_the_adapter_slot():
    # 12 blocks of 4 tokens: four requests of 8 + 12 tokens cannot all run at once.
    sim, cache, _ = lora_sim(max_loras=4, num_blocks=12)
    seqs = [sim.add(f"r{i}", 8, max_tokens=12, adapter_id=1 + i) for i in range(4)]
    run_checked(sim, cache)
    assert sim.scheduler.num_preemptions > 0 and any(s.num_preemptions for s in seqs)
    assert cache.num_pinned_slots == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(st.tuples(
        st.integers(1, 4), st.integers(1, 16), st.integers(1, 6), st.integers(0, 20)
    ), min_size=1, max_size=20),
    unloads=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 20)), max_size=4),
    max_loras=st.integers(1, 3),
)  # fmt: skip
def test_unloading_waits_for_every_live_user(requests, unloads, max_loras):
    """An unload refuses new requests at once, but the adapter leaves only after its last
    running or waiting sequence finished; every unload completes."""
    sim, cache, _ = lora_sim(max_loras=max_loras, max_cpu_loras=max_loras + 1, max_num_seqs=4)
    arrivals = sorted(enumerate(requests), key=lambda item: item[1][3])
    pending_unloads = sorted(unloads, key=lambda u: u[1])
    removed_at: dict[int, int] = {}
    admitted: list[str] = []
    step = 0
    while arrivals or pending_unloads or sim.scheduler.num_unfinished:
        while pending_unloads and pending_unloads[0][1] <= step:
            cache.begin_unregister(AdapterId(pending_unloads.pop(0)[0]))
        while arrivals and arrivals[0][1][3] <= step:
            i, (adapter, prompt, max_tokens, _) = arrivals.pop(0)
            if cache.is_known(AdapterId(adapter)) and not cache.is_unloading(AdapterId(adapter)):
                sim.add(f"r{i}", prompt, max_tokens=max_tokens, adapter_id=adapter)  # else: 404
                admitted.append(f"r{i}")
        out = sim.step()
        for item in out.scheduled:
            assert item.seq.adapter_id not in removed_at, "ran with an unloaded adapter"
        live = {AdapterId(s.adapter_id) for s in sim.scheduler.live_sequences() if s.adapter_id}
        for adapter_id in cache.finish_unregisters(live):
            assert adapter_id not in live
            removed_at[adapter_id] = sim.scheduler.num_steps  # the numbering finish_step uses
        cache.check_invariants()
        step += 1
        assert step < 2000
    assert sorted(sim.finish_order()) == sorted(admitted)
    assert not cache.unloading, "an unload never completed"
    for adapter_id, removed_step in removed_at.items():
        last_use = max(
            (
                sim.finish_step[s.request.request_id]
                for s in sim.finished
                if s.adapter_id == adapter_id
            ),
            default=-1,
        )
        assert last_use <= removed_step


request_st = st.tuples(
    st.integers(0, 5),  # adapter (0 = base model)
    st.integers(1, 24),  # prompt length
    st.integers(1, 8),  # max tokens
    st.integers(-2, 2),  # priority
    st.integers(0, 30),  # arrival step
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(request_st, min_size=1, max_size=24),
    max_loras=st.integers(1, 3),
    extra_cpu=st.integers(0, 2),
    num_blocks=st.integers(12, 64),
    policy=st.sampled_from(["priority", "fcfs"]),
    read_every=st.integers(0, 3),  # 0: reads finish at once; k: held, finished every k steps
)
def test_every_request_is_served_within_the_slot_limit(
    requests, max_loras, extra_cpu, num_blocks, policy, read_every
):
    sim, cache, source = lora_sim(
        hold_loads=read_every > 0,
        max_loras=max_loras,
        max_cpu_loras=max_loras + extra_cpu,
        num_blocks=num_blocks,
        max_num_seqs=6,
        max_num_batched_tokens=32,
        aging_steps=4,
        policy=policy,
    )
    pending = sorted(enumerate(requests), key=lambda item: item[1][4])
    step = 0
    while pending or sim.scheduler.num_unfinished:
        while pending and pending[0][1][4] <= step:
            i, (adapter, prompt, max_tokens, priority, _) = pending.pop(0)
            sim.add(
                f"r{i}", prompt, max_tokens=max_tokens,
                priority=priority if policy == "priority" else 0,
                adapter_id=adapter or None,
            )  # fmt: skip
        if read_every and step % read_every == 0:
            source.complete_all()
        out = sim.step()
        assert len(distinct_adapters(out)) <= max_loras
        cache.check_invariants()
        sim.scheduler.check_invariants()
        step += 1
        assert step < 3000, "a request was never served"
    assert sorted(sim.finish_order()) == sorted(f"r{i}" for i in range(len(requests)))
    assert cache.num_pinned_slots == 0


def test_a_step_looks_past_at_most_max_num_seqs_requests_without_a_slot():
    # The bound that keeps a step's cost independent of the line's length: three requests for
    # an adapter that gets no slot lie ahead of a base-model request. With 4 seats the step
    # looks past all three and admits it; with 3 it stops after three passed over.
    for max_num_seqs, is_admitted in ((4, True), (3, False)):
        sim, _, _ = lora_sim(max_loras=1, max_num_seqs=max_num_seqs)
        sim.add("a0", 4, max_tokens=20, adapter_id=1)
        sim.step()  # a0 pins the only slot
        for i in range(3):
            sim.add(f"b{i}", 4, max_tokens=2, adapter_id=2)
        sim.add("base", 4, max_tokens=2)
        names = {s.seq.request.request_id for s in sim.step().scheduled}
        assert ("base" in names) is is_admitted
        sim.run()  # and everything is served
        assert len(sim.finished) == 5


def test_priority_preemption_looks_past_at_most_max_num_seqs_requests_without_a_slot():
    for max_num_seqs, preempts in ((3, True), (2, False)):
        sim, _, _ = lora_sim(max_loras=1, max_num_seqs=max_num_seqs)
        for i in range(max_num_seqs):
            sim.add(f"a{i}", 4, max_tokens=20, priority=3, adapter_id=1)
        sim.step()  # a full batch pins adapter 1's slot
        for i in range(2):
            sim.add(f"b{i}", 4, max_tokens=2, priority=-5, adapter_id=2)  # no slot for these
        sim.add("urgent", 4, max_tokens=2, priority=-4)
        out = sim.step()
        assert bool(out.preempted) is preempts
        sim.run()
        assert len(sim.finished) == max_num_seqs + 3


def count_pops(sim: Sim) -> list[int]:
    """Wrap the waiting line's pop: the list's one element counts the calls."""
    calls = [0]
    queue = sim.scheduler.waiting
    pop = queue.pop

    def counted() -> object:
        calls[0] += 1
        return pop()

    queue.pop = counted  # type: ignore[method-assign]
    return calls


def test_a_line_of_requests_without_a_slot_is_not_walked():
    # Admission: 7 of 8 seats taken by adapter 1's requests, which pin the only slot; 20
    # requests for adapter 2 wait. The step takes its front (1 seat + 1) and, finding nothing
    # else in line it could admit (no base-model request, no adapter with a slot), stops
    # there instead of looking past max_num_seqs = 8 of them.
    sim, _, _ = lora_sim(max_loras=1, max_num_seqs=8)
    for i in range(7):
        sim.add(f"a{i}", 4, max_tokens=30, adapter_id=1)
    sim.step()
    for i in range(20):
        sim.add(f"b{i}", 4, max_tokens=2, adapter_id=2)
    pops = count_pops(sim)
    assert not [s for s in sim.step().scheduled if s.seq.adapter_id == 2]
    assert pops[0] == 2
    # A base-model request at the end of the line is still looked for (max_num_seqs deep).
    sim.add("base", 4, max_tokens=2)
    pops[0] = 0
    sim.step()
    assert pops[0] == 8
    sim.run()
    assert len(sim.finished) == 28

    # Priority preemption: the requests that outrank the running ones all wait for a slot, so
    # the search for a candidate pops nothing (the step's front is its one pop).
    sim, _, _ = lora_sim(max_loras=1, max_num_seqs=3)
    for i in range(3):
        sim.add(f"a{i}", 4, max_tokens=20, priority=3, adapter_id=1)
    sim.step()
    for i in range(10):
        sim.add(f"b{i}", 4, max_tokens=2, priority=-5, adapter_id=2)
    pops = count_pops(sim)
    assert not sim.step().preempted
    assert pops[0] == 1
    sim.run()
    assert len(sim.finished) == 13
