"""Currency budgets (issue 45, item 2): the same admission as the token budgets, in micro-units
of the currency, run against the in-process and the Redis store; exact at the bound also across
four processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tenancy.ids import RequestId
from tenancy.quota.memory_store import InProcessQuotaStore
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

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[QuotaStore]:
    made: QuotaStore
    if request.param == "inprocess":
        made = InProcessQuotaStore(lease_ttl_s=30)
    else:
        client = make_redis(request.getfixturevalue("redis_url"))
        made = RedisQuotaStore(
            client, prefix=request.getfixturevalue("redis_prefix"), lease_ttl_s=30
        )
    yield made
    await made.close()


def rid() -> RequestId:
    return RequestId(str(uuid.uuid4()))


def subject(prefix: str = "t", **limits: int) -> QuotaSubject:
    return QuotaSubject(f"{prefix}:{uuid.uuid4().hex[:8]}", QuotaLimits(**limits))


async def admit_many(
    store: QuotaStore, subjects: list[QuotaSubject], micros: list[int]
) -> tuple[list[Admission], list[QuotaExceeded]]:
    async def one(m: int) -> Admission | QuotaExceeded:
        try:
            return await store.admit(
                request_id=rid(), subjects=subjects, reserve_tokens=1, reserve_micros=m
            )
        except QuotaExceeded as exc:
            return exc

    results = await asyncio.gather(*(one(m) for m in micros))
    return (
        [r for r in results if isinstance(r, Admission)],
        [r for r in results if isinstance(r, QuotaExceeded)],
    )


async def test_a_burst_stops_exactly_at_the_daily_spend_budget(store: QuotaStore) -> None:
    tenant = subject(daily_spend_budget_micros=1000)
    admitted, rejected = await admit_many(store, [tenant], [300] * 50)
    assert sum(a.reserved_micros for a in admitted) == 900  # three fit, the fourth would overrun
    assert len(rejected) == 47
    exc = rejected[0]
    assert exc.limit is Limit.DAILY_SPEND and exc.status_code == 429
    assert exc.error_type == "insufficient_quota" and exc.headers["x-should-retry"] == "false"
    assert "daily_spend_budget_micros" in exc.message
    # A request of the exact remainder fits: the bound is inclusive, as for token budgets.
    last = await store.admit(
        request_id=rid(), subjects=[tenant], reserve_tokens=1, reserve_micros=100
    )
    assert last.reserved_micros == 100
    usage = await store.usage(tenant.key)
    assert (usage.day_spend_micros, usage.month_spend_micros) == (1000, 1000)
    assert usage.day_tokens == 4  # the token counters go on as before


async def test_settlement_refunds_the_unused_cost(store: QuotaStore) -> None:
    tenant = subject(monthly_spend_budget_micros=1000)
    first = await store.admit(
        request_id=rid(), subjects=[tenant], reserve_tokens=50, reserve_micros=800
    )
    with pytest.raises(QuotaExceeded) as info:
        await store.admit(request_id=rid(), subjects=[tenant], reserve_tokens=1, reserve_micros=300)
    assert info.value.limit is Limit.MONTHLY_SPEND
    await store.settle(first, used_tokens=20, used_micros=250)
    await store.settle(first, used_tokens=20, used_micros=250)  # idempotent
    usage = await store.usage(tenant.key)
    assert (usage.month_spend_micros, usage.day_spend_micros, usage.day_tokens) == (250, 250, 20)
    await store.admit(request_id=rid(), subjects=[tenant], reserve_tokens=1, reserve_micros=750)
    assert (await store.usage(tenant.key)).month_spend_micros == 1000


async def test_a_keys_spend_budget_binds_beside_its_tenants(store: QuotaStore) -> None:
    tenant = subject(daily_spend_budget_micros=10_000)
    key = subject("k", daily_spend_budget_micros=500)
    admitted, rejected = await admit_many(store, [tenant, key], [100] * 8)
    assert len(admitted) == 5 and rejected[0].subject_key == key.key
    other = subject("k")
    admitted, _ = await admit_many(store, [tenant, other], [1000] * 12)
    assert len(admitted) == 9  # the tenant's 10,000 binds: 500 + 9 x 1000
    assert (await store.usage(tenant.key)).day_spend_micros == 9500


async def test_unpriced_requests_leave_token_budgets_as_they_were(store: QuotaStore) -> None:
    tenant = subject(daily_token_budget=100, daily_spend_budget_micros=0)
    first = await store.admit(request_id=rid(), subjects=[tenant], reserve_tokens=60)
    with pytest.raises(QuotaExceeded) as info:
        await store.admit(request_id=rid(), subjects=[tenant], reserve_tokens=60)
    assert info.value.limit is Limit.DAILY  # a zero spend budget admits what costs nothing
    await store.settle(first, used_tokens=60)
    usage = await store.usage(tenant.key)
    assert (usage.day_tokens, usage.day_spend_micros) == (60, 0)
    with pytest.raises(QuotaExceeded) as info:
        await store.admit(request_id=rid(), subjects=[tenant], reserve_tokens=1, reserve_micros=1)
    assert info.value.limit is Limit.DAILY_SPEND


def _worker(
    url: str, prefix: str, budget: int, cost: int, start_at: float
) -> subprocess.Popen[str]:
    script = str(Path(__file__).with_name("spend_worker.py"))
    args = [sys.executable, script, url, prefix, str(budget), str(cost), "40", repr(start_at)]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.mark.redis
def test_four_processes_stop_exactly_at_the_spend_budget(redis_url: str, redis_prefix: str) -> None:
    budget, cost = 1_234_567, 20_001  # 61 requests fit (1,220,061); the 62nd would overrun
    start_at = time.time() + 2.0
    procs = [_worker(redis_url, redis_prefix, budget, cost, start_at) for _ in range(4)]
    outputs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(o["admitted"] for o in outputs) == budget // cost == 61
    assert sum(o["rejected"] for o in outputs) == 160 - 61
    assert {limit for o in outputs for limit in o["limits"]} == {"daily_spend_budget_micros"}

    async def spent() -> int:
        store = RedisQuotaStore(make_redis(redis_url), prefix=redis_prefix, lease_ttl_s=60)
        try:
            return (await store.usage("t:spender")).day_spend_micros
        finally:
            await store.close()

    assert asyncio.run(spent()) == 61 * cost
