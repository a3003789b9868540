"""engine/scheduling/scheduler.py (the waiting line as an index) makes the same choices as
ReferenceScheduler (tests/engine/scheduling/reference_scheduler.py), the rules of its docstring by
brute force, over random operation sequences: arrivals of every priority (ignored under fcfs),
tenant and adapter, requests of several choices, prompt logprobs (no prefix hit), aborts, KV
pressure, adapter slots, disk reads held in flight for some steps, and an adapter that cannot be
read. Every step's scheduled, preempted and failed sequences, the running order, the waiting
set, the fair-share counters and the adapter cache's reads must agree."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.outputs import FinishReason, SchedulerOutput
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from lora.cache import AdapterCache
from lora.registry import AdapterId
from tests.engine.scheduling.reference_scheduler import ReferenceScheduler
from tests.engine.scheduling.sched_sim import Sim
from tests.lora.fake_source import FakeSource

UNREADABLE = 4

arrival_st = st.tuples(
    st.integers(-1, 2),  # priority
    st.integers(0, 3),  # tenant
    st.integers(1, 24),  # prompt length (prompts share prefixes: 1, 2, 3, ...)
    st.integers(1, 8),  # max tokens
    st.integers(0, 4),  # adapter (0: the base model; 4 cannot be read)
    st.sampled_from([1, 1, 1, 2, 3]),  # choices
    st.sampled_from([None, None, None, 0]),  # prompt logprobs
)
step_st = st.tuples(
    st.lists(arrival_st, max_size=4),
    st.lists(st.integers(0, 1000), max_size=1),  # aborts: index into the live sequences
    st.booleans(),  # held disk reads finish before this step
)


def make_sim(cls: Any, config: EngineConfig, num_blocks: int, hold_loads: bool) -> Sim:
    cache: AdapterCache[str] | None = None
    if config.enable_lora:
        lora = config.max_loras or 1
        source = FakeSource(unreadable={AdapterId(UNREADABLE)}, hold_loads=hold_loads)
        cache = AdapterCache(
            max_loras=lora, max_cpu_loras=config.num_cpu_loras(lora), source=source
        )
        for i in range(1, UNREADABLE + 1):
            cache.register(AdapterId(i))
    return Sim(cls(config, BlockManager(num_blocks, config.block_size), cache))


def summary(out: SchedulerOutput) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    return (
        [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled],
        [s.seq_id for s in out.preempted],
        [f.seq.seq_id for f in out.failed],
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(step_st, min_size=1, max_size=40),
    policy=st.sampled_from(["priority", "fcfs"]),
    max_num_seqs=st.integers(1, 5),
    max_num_batched_tokens=st.integers(6, 40),
    num_blocks=st.integers(8, 40),
    aging_steps=st.integers(1, 6),
    lora=st.sampled_from([None, 1, 2, 3]),  # None: no adapter cache; else max_loras
    hold_loads=st.booleans(),
)
def test_same_choices_as_the_brute_force_reference(
    steps, policy, max_num_seqs, max_num_batched_tokens, num_blocks, aging_steps, lora, hold_loads
):
    config = EngineConfig(
        model="unused", block_size=4, policy=policy, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, aging_steps=aging_steps,
        enable_lora=lora is not None, max_loras=lora or 1,
        max_cpu_loras=(lora or 1) + 1,
    )  # fmt: skip
    sims = [
        make_sim(Scheduler, config, num_blocks, hold_loads),
        make_sim(ReferenceScheduler, config, num_blocks, hold_loads),
    ]
    count = 0
    for arrivals, aborts, finish_reads in [*steps, *[([], [], True)] * 60]:
        for priority, tenant, prompt, max_tokens, adapter, n, prompt_logprobs in arrivals:
            for sim in sims:
                sim.add_choices(
                    f"r{count}", prompt, n=n, max_tokens=max_tokens, priority=priority,
                    tenant=f"t{tenant}", adapter_id=(adapter or None) if lora else None,
                    prompt_logprobs=prompt_logprobs,
                )  # fmt: skip
            count += 1
        for index in aborts:
            for sim in sims:
                live = sorted(sim.scheduler.live_sequences(), key=lambda s: s.seq_id)
                if live:
                    seq = live[index % len(live)]
                    sim.scheduler.finish(seq)
                    seq.finish_reason = FinishReason.ABORT
        if finish_reads and lora:
            for sim in sims:
                sim.scheduler.adapters._source.complete_all()
        outs = [summary(sim.step()) for sim in sims]
        assert outs[0] == outs[1]
        index, reference = (sim.scheduler for sim in sims)
        assert [s.seq_id for s in index.running] == [s.seq_id for s in reference.running]
        assert {s.seq_id for s in index.waiting} == {s.seq_id for s in reference.waiting}
        assert index.fairness.snapshot() == reference.fairness.snapshot()
        if lora:
            # The same plan (prefetch, eviction preference) for the adapter cache.
            caches = [sim.scheduler.adapters for sim in sims]
            stats = [replace(c.stats, load_seconds=0.0) for c in caches]  # wall time aside
            assert stats[0] == stats[1]
            sources = [c._source for c in caches]
            assert sources[0].loads == sources[1].loads
            assert sources[0].activations == sources[1].activations
    assert sims[0].finish_order() == sims[1].finish_order()
