"""Acceptance 2: quota semantics, one suite run against the in-process and the Redis store."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tenancy.errors import ServiceUnavailable
from tenancy.ids import RequestId
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.quota.pipelined import PipelinedRedis
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import (
    Admission,
    Limit,
    QuotaExceeded,
    QuotaLimits,
    QuotaStore,
    QuotaSubject,
)
from tenancy.redis_client import make_redis

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


MakeStore = Callable[[FakeClock, float], Awaitable[QuotaStore]]


@pytest.fixture(
    params=[
        "inprocess",
        pytest.param("redis", marks=pytest.mark.redis),
        # the gateway's client for a single server (tenancy/quota/pipelined.py)
        pytest.param("redis-pipelined", marks=pytest.mark.redis),
    ]
)
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[MakeStore]:
    stores: list[QuotaStore] = []

    async def make(clock: FakeClock, lease_ttl_s: float = 30.0) -> QuotaStore:
        store: QuotaStore
        if request.param == "inprocess":
            store = InProcessQuotaStore(lease_ttl_s=lease_ttl_s, clock=clock)
        else:
            url = request.getfixturevalue("redis_url")
            prefix = request.getfixturevalue("redis_prefix")
            client = PipelinedRedis(url) if request.param == "redis-pipelined" else make_redis(url)
            store = RedisQuotaStore(client, prefix=prefix, lease_ttl_s=lease_ttl_s, clock=clock)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


def rid() -> RequestId:
    return RequestId(str(uuid.uuid4()))


def tenant(**limits: int) -> QuotaSubject:
    return QuotaSubject(f"t:{uuid.uuid4().hex[:8]}", QuotaLimits(**limits))


async def admit_many(
    store: QuotaStore, subjects: list[QuotaSubject], reserves: list[int]
) -> tuple[list[Admission], list[QuotaExceeded]]:
    async def one(r: int) -> Admission | QuotaExceeded:
        try:
            return await store.admit(request_id=rid(), subjects=subjects, reserve_tokens=r)
        except QuotaExceeded as exc:
            return exc

    results = await asyncio.gather(*(one(r) for r in reserves))
    return (
        [r for r in results if isinstance(r, Admission)],
        [r for r in results if isinstance(r, QuotaExceeded)],
    )


async def test_rpm_admits_exactly_the_limit(make_store: MakeStore) -> None:
    clock = FakeClock()
    store = await make_store(clock, 30.0)
    subject = tenant(requests_per_minute=100, tokens_per_minute=1_000_000)
    admitted, rejected = await admit_many(store, [subject], [10] * 200)
    assert len(admitted) == 100 and len(rejected) == 100
    exc = rejected[0]
    assert exc.limit is Limit.RPM and exc.status_code == 429
    assert exc.code == "rate_limit_exceeded" and exc.error_type == "rate_limit_error"
    assert 0 < exc.retry_after_s <= 60
    assert exc.headers["x-ratelimit-limit-requests"] == "100"
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"
    assert exc.headers["x-ratelimit-remaining-tokens"] == str(1_000_000 - 1000)
    assert exc.headers["retry-after"] == "60" and "x-should-retry" not in exc.headers
    assert admitted[-1].rate.headers()["x-ratelimit-limit-tokens"] == "1000000"
    # Rejected requests were never counted; the window slides after 60 s.
    assert (await store.usage(subject.key)).num_requests == 100
    clock.t += 60.001
    admitted2, _ = await admit_many(store, [subject], [10] * 5)
    assert len(admitted2) == 5


async def test_reservations_and_settlements_add_up_to_real_usage(make_store: MakeStore) -> None:
    clock = FakeClock()
    store = await make_store(clock, 30.0)
    subject = tenant(tokens_per_minute=10**9, daily_token_budget=10**9)
    rng = random.Random(7)
    reserves = [rng.randint(1, 500) for _ in range(120)]
    admitted, rejected = await admit_many(store, [subject], reserves)
    assert not rejected
    usage = await store.usage(subject.key)
    assert usage.num_tokens == usage.day_tokens == usage.month_tokens == sum(reserves)
    used = [rng.randint(0, a.reserved_tokens) for a in admitted]
    await asyncio.gather(
        *(store.settle(a, used_tokens=u) for a, u in zip(admitted, used, strict=True))
    )
    await store.settle(admitted[0], used_tokens=999_999)  # idempotent: ignored
    usage = await store.usage(subject.key)
    assert usage.num_tokens == usage.day_tokens == usage.month_tokens == sum(used)
    assert usage.num_leases == 0 and usage.num_requests == 120
    clock.t += 61  # tokens leave the window; the budgets keep them
    usage = await store.usage(subject.key)
    assert usage.num_tokens == 0 and usage.day_tokens == sum(used)


async def test_unsettled_leases_are_reclaimed_after_expiry(make_store: MakeStore) -> None:
    clock = FakeClock()
    store = await make_store(clock, 30.0)
    subject = tenant(max_concurrent=1000)
    for chunk in range(10):
        admitted, rejected = await admit_many(store, [subject], [1] * 100)
        assert len(admitted) == 100, chunk
    assert (await store.usage(subject.key)).num_leases == 1000
    _, rejected = await admit_many(store, [subject], [1])
    assert rejected[0].limit is Limit.CONCURRENCY and 0 < rejected[0].retry_after_s <= 1
    clock.t += 30.0
    assert (await store.usage(subject.key)).num_leases == 0
    admitted, _ = await admit_many(store, [subject], [1])
    assert len(admitted) == 1


async def test_burst_against_tiny_budget(make_store: MakeStore) -> None:
    store = await make_store(FakeClock(), 30.0)
    budget, reservation = 1000, 300
    subject = tenant(daily_token_budget=budget)
    admitted, rejected = await admit_many(store, [subject], [reservation] * 50)
    total = sum(a.reserved_tokens for a in admitted)
    assert total <= budget + reservation
    assert total == 900  # exact: three fit, the fourth would overrun
    exc = rejected[0]
    assert exc.limit is Limit.DAILY and exc.status_code == 429
    assert exc.error_type == "insufficient_quota" and exc.headers["x-should-retry"] == "false"


async def test_monthly_budget_and_tpm(make_store: MakeStore) -> None:
    clock = FakeClock()
    store = await make_store(clock, 30.0)
    subject = tenant(tokens_per_minute=1000, monthly_token_budget=5000)
    first = await store.admit(request_id=rid(), subjects=[subject], reserve_tokens=600)
    with pytest.raises(QuotaExceeded) as info:
        await store.admit(request_id=rid(), subjects=[subject], reserve_tokens=600)
    assert info.value.limit is Limit.TPM and 59 <= info.value.retry_after_s <= 60
    await store.settle(first, used_tokens=100)  # the refund makes room at once
    await store.admit(request_id=rid(), subjects=[subject], reserve_tokens=600)
    for _ in range(6):
        clock.t += 61
        try:
            await store.admit(request_id=rid(), subjects=[subject], reserve_tokens=900)
        except QuotaExceeded as exc:
            assert exc.limit is Limit.MONTHLY and exc.headers["x-should-retry"] == "false"
            break
    else:
        pytest.fail("monthly budget never enforced")
    assert (await store.usage(subject.key)).month_tokens <= 5000


async def test_key_and_tenant_limits_are_checked_together(make_store: MakeStore) -> None:
    store = await make_store(FakeClock(), 30.0)
    t = tenant(requests_per_minute=10)
    key = QuotaSubject(f"k:{uuid.uuid4().hex[:8]}", QuotaLimits(requests_per_minute=3))
    admitted, rejected = await admit_many(store, [t, key], [1] * 5)
    assert len(admitted) == 3 and rejected[0].subject_key == key.key
    # Concurrent admissions finish in any order; the last one to run saw 0 remaining.
    remaining = sorted(a.rate.headers()["x-ratelimit-remaining-requests"] for a in admitted)
    assert remaining == ["0", "1", "2"]
    other_key = QuotaSubject(f"k:{uuid.uuid4().hex[:8]}", QuotaLimits())
    admitted, _ = await admit_many(store, [t, other_key], [1] * 10)
    assert len(admitted) == 7  # the tenant's limit binds; rejected admissions reserved nothing
    assert (await store.usage(key.key)).num_requests == 3


def _worker(redis_url: str, prefix: str, start_at: float, client: str) -> subprocess.Popen[str]:
    script = str(Path(__file__).with_name("quota_worker.py"))
    return subprocess.Popen(
        [sys.executable, script, redis_url, prefix, "100", "50", repr(start_at), client],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.redis
@pytest.mark.parametrize("client", ["redis-py", "pipelined"])
def test_four_processes_admit_exactly_the_limit(
    redis_url: str, redis_prefix: str, client: str
) -> None:
    start_at = time.time() + 2.0
    procs = [_worker(redis_url, redis_prefix, start_at, client) for _ in range(4)]
    outputs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    admitted = [r for o in outputs for r in o["admitted"]]
    assert len(admitted) == 100 and sum(o["rejected"] for o in outputs) == 100

    async def check() -> None:
        client = aioredis.Redis.from_url(redis_url)
        store = RedisQuotaStore(client, prefix=redis_prefix, lease_ttl_s=60)
        usage = await store.usage("t:shared")
        await store.close()
        assert usage.num_requests == 100 and usage.num_tokens == sum(admitted)
        assert usage.num_leases == 100

    asyncio.run(check())


async def test_redis_down_fails_closed_with_503() -> None:
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    store = RedisQuotaStore(client, prefix="lgtest:down:", lease_ttl_s=30)
    with pytest.raises(ServiceUnavailable) as info:
        await store.admit(request_id=rid(), subjects=[tenant()], reserve_tokens=1)
    assert info.value.status_code == 503
    await store.close()


@pytest.mark.redis
async def test_script_reloads_after_script_flush(
    redis_url: str, redis_prefix: str, aredis: aioredis.Redis
) -> None:
    store = RedisQuotaStore(aioredis.Redis.from_url(redis_url), prefix=redis_prefix, lease_ttl_s=30)
    subject = tenant(requests_per_minute=5)
    await store.admit(request_id=rid(), subjects=[subject], reserve_tokens=1)
    await aredis.script_flush()
    await store.admit(request_id=rid(), subjects=[subject], reserve_tokens=1)
    assert (await store.usage(subject.key)).num_requests == 2
    await store.close()


async def test_a_replayed_admission_stands_and_counts_once(make_store: MakeStore) -> None:
    """A client that lost the reply resends the same call (tenancy/redis_client.py retries on a
    dropped connection): the second admit answers admitted, charges nothing more, and the one
    settlement ends the one lease (it was a 500 and a reservation never refunded before)."""
    clock = FakeClock()
    store = await make_store(clock, 30.0)
    subject = tenant(requests_per_minute=10, daily_token_budget=1000, max_concurrent=5)
    request_id = rid()
    first = await store.admit(request_id=request_id, subjects=[subject], reserve_tokens=300)
    again = await store.admit(request_id=request_id, subjects=[subject], reserve_tokens=300)
    assert again.request_id == first.request_id and again.reserved_tokens == 300
    usage = await store.usage(subject.key)
    assert (usage.num_requests, usage.num_leases, usage.day_tokens) == (1, 1, 300)
    await store.settle(again, used_tokens=120)
    usage = await store.usage(subject.key)
    assert (usage.num_requests, usage.num_leases, usage.day_tokens) == (1, 0, 120)
