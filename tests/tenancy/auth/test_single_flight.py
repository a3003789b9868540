"""Concurrent loads of one key share one load; a waiter's cancellation does not cancel it."""

from __future__ import annotations

import asyncio

import pytest

from tenancy.auth.single_flight import SingleFlight


async def test_concurrent_misses_share_one_load_and_survive_a_cancelled_waiter() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    release = asyncio.Event()
    loads = 0

    async def load() -> int:
        nonlocal loads
        loads += 1
        await release.wait()
        return 42

    waiters = [asyncio.create_task(flight.run("k", load)) for _ in range(20)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # the first caller gives up; the load goes on for the others
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert loads == 1
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [42] * 19
    assert await flight.run("k", load) == 42 and loads == 2  # done: the next miss loads again


async def test_an_error_reaches_every_waiter_once() -> None:
    flight: SingleFlight[str, int] = SingleFlight()

    async def load() -> int:
        await asyncio.sleep(0.01)
        raise LookupError("down")

    results = await asyncio.gather(
        *(flight.run("k", load) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, LookupError) for r in results)
    with pytest.raises(LookupError):
        await flight.run("k", load)
