"""The rejection log's last hour, in both kinds (in-process and Redis): counts by subject and
reason, one-minute buckets, an hour's window that forgets older minutes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from tenancy.quota.rejections import InProcessRejectionLog, RedisRejectionLog, RejectionLog
from tenancy.redis_client import make_redis


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0  # on a minute boundary

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)])
async def make_log(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[[Clock], RejectionLog]]:
    clients = []

    def make(clock: Clock) -> RejectionLog:
        if request.param == "inprocess":
            return InProcessRejectionLog(clock=clock)
        client = make_redis(request.getfixturevalue("redis_url"))
        clients.append(client)
        return RedisRejectionLog(
            client, prefix=request.getfixturevalue("redis_prefix"), clock=clock
        )

    yield make
    for client in clients:
        await client.aclose()


async def test_counts_by_subject_and_reason(make_log: Callable[[Clock], RejectionLog]) -> None:
    clock = Clock()
    log = make_log(clock)
    await log.record(("t:a", "k:1"), "rate_limit_exceeded")
    await log.record(("t:a",), "rate_limit_exceeded")
    await log.record(("t:a",), "model_not_found")
    await log.record(("t:b",), "insufficient_quota")
    assert await log.last_hour("t:a") == {"rate_limit_exceeded": 2, "model_not_found": 1}
    assert await log.last_hour("k:1") == {"rate_limit_exceeded": 1}
    assert await log.last_hour("t:b") == {"insufficient_quota": 1}
    assert await log.last_hour("t:nobody") == {}


async def test_the_hour_slides(make_log: Callable[[Clock], RejectionLog]) -> None:
    clock = Clock()
    log = make_log(clock)
    await log.record(("t:a",), "rate_limit_exceeded")  # minute 0
    clock.t += 30 * 60
    await log.record(("t:a",), "rate_limit_exceeded")  # minute 30
    clock.t += 29 * 60 + 59  # minute 59: both still inside
    assert await log.last_hour("t:a") == {"rate_limit_exceeded": 2}
    clock.t += 1  # minute 60: the first minute has left the hour
    assert await log.last_hour("t:a") == {"rate_limit_exceeded": 1}
    clock.t += 30 * 60
    assert await log.last_hour("t:a") == {}
