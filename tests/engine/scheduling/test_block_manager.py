"""Block accounting and prefix caching, without a model."""

from __future__ import annotations

import pytest

from tests.engine.scheduling.sched_sim import Sim


def test_same_salt_hits_full_blocks_and_last_token_is_recomputed():
    sim = Sim.create(block_size=4)
    first = sim.add("a", 10, salt="s1")
    sim.run()
    assert first.num_cached_tokens == 0
    second = sim.add("b", 10, salt="s1")
    sim.step()
    # 10 prompt tokens = 2 full blocks (8 tokens) + 2; full blocks come from the cache.
    assert second.num_cached_tokens == 8
    sim.run()


def test_full_prompt_in_cache_still_recomputes_one_token():
    sim = Sim.create(block_size=4)
    sim.add("a", 8, salt="s")
    sim.run()
    again = sim.add("b", 8, salt="s")
    sim.step()
    assert again.num_cached_tokens == 4  # not 8: the last position must be computed to sample


@pytest.mark.parametrize(
    "first, second",
    [
        ({"salt": "s1"}, {"salt": "s2"}),
        ({"salt": None}, {"salt": "s2"}),
        ({"salt": "s1", "adapter_id": 1}, {"salt": "s1", "adapter_id": 2}),
        ({"salt": "s1", "adapter_id": 1}, {"salt": "s1", "adapter_id": None}),
    ],
)
def test_another_salt_or_adapter_never_shares_a_block(first, second):
    sim = Sim.create(block_size=4)
    sim.add("a", 12, **first)
    sim.run()
    other = sim.add("b", 12, **second)
    sim.step()
    assert other.num_cached_tokens == 0
    sim.run()


def test_invariants_hold_after_aborts_and_free_blocks_return():
    sim = Sim.create(num_blocks=64, block_size=4)
    seqs = [sim.add(f"r{i}", 9 + i, max_tokens=6, salt="x") for i in range(6)]
    sim.step()
    sim.step()
    for seq in seqs[::2]:
        sim.scheduler.finish(seq)  # abort mid-flight
        sim.block_manager.check_invariants(sim.scheduler.live_sequences())
    sim.run()
    assert sim.block_manager.num_free_blocks == 64
    sim.block_manager.check_invariants([])


def test_cached_free_blocks_are_evicted_lru_and_index_stays_consistent():
    sim = Sim.create(num_blocks=8, block_size=4)
    for i in range(10):
        sim.add(f"r{i}", [100 * i + j for j in range(12)], max_tokens=2, salt="s")
        sim.run()
    assert sim.block_manager.num_free_blocks == 8
    # The most recent prompt is still cached; the oldest was evicted by reuse.
    recent = sim.add("recent", [900 + j for j in range(12)], max_tokens=1, salt="s")
    sim.step()
    assert recent.num_cached_tokens == 8
    sim.run()
    old = sim.add("old", list(range(12)), max_tokens=1, salt="s")
    sim.step()
    assert old.num_cached_tokens == 0
    sim.run()


def test_grow_takes_blocks_only_past_the_last_one_and_nothing_when_short():
    sim = Sim.create(block_size=4, num_blocks=4)
    seq = sim.add("a", 6)
    sim.step()  # the whole prompt: 2 blocks
    bm = sim.scheduler.block_manager
    held = list(seq.block_table)
    assert len(held) == 2 and bm.num_free_blocks == 2
    assert bm.grow(seq, 2)  # positions 6, 7: inside the second block
    assert seq.block_table == held and bm.num_free_blocks == 2
    assert not bm.grow(seq, 11)  # 17 tokens = 5 blocks: 3 more, 2 free
    assert seq.block_table == held and bm.num_free_blocks == 2
    assert bm.grow(seq, 10)  # 16 tokens = 4 blocks
    assert seq.block_table[:2] == held and len(seq.block_table) == 4
    assert bm.num_free_blocks == 0
