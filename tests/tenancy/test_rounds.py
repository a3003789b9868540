"""tenancy/rounds.py: the background round loop behind the usage ledger's writer and the alerts."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tenancy.rounds import RoundLoop

pytestmark = pytest.mark.asyncio


async def test_rounds_run_when_woken_one_at_a_time_and_failures_do_not_stop_them() -> None:
    started: list[int] = []
    failures: list[Exception] = []
    release = asyncio.Event()

    async def work() -> None:
        started.append(len(started))
        if len(started) == 1:
            raise RuntimeError("the database is down")
        await release.wait()

    loop = RoundLoop(work, name="test", on_failure=failures.append)
    loop.start()
    await asyncio.sleep(0.05)
    assert started == []  # no interval: nothing until woken
    loop.wake()
    await asyncio.sleep(0.05)
    assert started == [0] and [type(f) for f in failures] == [RuntimeError]
    loop.wake()
    await asyncio.sleep(0.05)
    loop.wake()  # while round 1 runs: noted, not a second round at once
    await asyncio.sleep(0.05)
    assert started == [0, 1]
    release.set()
    await asyncio.sleep(0.05)
    assert started == [0, 1, 2]  # the wake-up that came mid-round
    await loop.close()


async def test_an_interval_runs_rounds_without_wake_ups() -> None:
    rounds = 0

    async def work() -> None:
        nonlocal rounds
        rounds += 1

    loop = RoundLoop(work, name="test", on_failure=lambda exc: None, interval_s=0.02)
    loop.start()
    await asyncio.sleep(0.2)
    await loop.close()
    assert rounds >= 3


async def test_close_lets_the_round_under_way_finish() -> None:
    finished = asyncio.Event()
    entered = asyncio.Event()

    async def work() -> None:
        entered.set()
        await asyncio.sleep(0.1)  # a write in progress: cancelling it could lose a batch
        finished.set()

    loop = RoundLoop(work, name="test", on_failure=lambda exc: None)
    loop.start()
    loop.wake()
    await entered.wait()
    await loop.close()
    assert finished.is_set()
    await RoundLoop(work, name="never started", on_failure=lambda exc: None).close()


async def test_a_failed_round_pauses_before_the_next() -> None:
    times: list[float] = []

    async def work() -> None:
        times.append(asyncio.get_running_loop().time())
        raise OSError("down")

    loop = RoundLoop(
        work, name="test", on_failure=lambda exc: None, interval_s=0.0, pause_after_failure_s=0.1
    )
    loop.start()
    await asyncio.sleep(0.35)
    await loop.close()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 2 <= len(times) <= 5 and all(g >= 0.09 for g in gaps)
