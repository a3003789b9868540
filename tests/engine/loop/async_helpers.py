"""Checks on a real AsyncEngine that the async-engine and engine-server tests share."""

from __future__ import annotations

import asyncio

from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine

TIMEOUT_S = 30  # a hang fails the test instead of the whole run


async def assert_idle_and_consistent(engine: AsyncEngine) -> None:
    await asyncio.wait_for(engine.wait_until_idle(), TIMEOUT_S)
    await engine.run_in_loop(lambda e: e.check_invariants())
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert engine.num_in_flight == 0


async def shut_down_checked(async_engine: AsyncEngine, llm_engine: LLMEngine) -> None:
    """Stop the loop thread without draining, then check the engine it drove: nothing left
    unfinished, every invariant holding."""
    await asyncio.wait_for(async_engine.shutdown(drain_timeout_s=0), TIMEOUT_S)
    # The loop thread is gone: this thread may touch the LLMEngine now.
    assert not llm_engine.has_unfinished_requests()
    llm_engine.check_invariants()
