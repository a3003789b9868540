"""The in-process quota store is restored from the usage ledger at start: a restart never hands a
tenant back tokens it spent this UTC day or month (the Redis store keeps its own counters)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

import pytest

from tenancy.adapters.validation import FormatChecksValidator
from tenancy.crud.usage import UsageIn, record_usage_batch
from tenancy.ids import ApiKeyId, RequestId, TenantId
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.quota.store import Limit, QuotaExceeded, QuotaLimits, QuotaSubject
from tenancy.runtime import build_runtime
from tenancy.settings import BaseModelSpec, TenancySettings
from tenancy.sql.migrate import upgrade
from tenancy.sql.models import Adapter

# Mid-month, mid-day: "earlier today", "earlier this month" and "last month" are all distinct.
NOW = dt.datetime(2026, 11, 18, 15, 30, tzinfo=dt.UTC)


def _row(
    tenant: str,
    key: str | None,
    started: dt.datetime,
    prompt: int,
    completion: int,
    *,
    model: str = "tiny",
    adapter_id: str | None = None,
) -> UsageIn:
    return UsageIn(
        request_id=RequestId(uuid.uuid4().hex),
        tenant_id=TenantId(tenant),
        api_key_id=ApiKeyId(key) if key else None,
        model=model,
        adapter_id=adapter_id,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=0,
        finish_reason="length",
        started_at=started,
        finished_at=started + dt.timedelta(seconds=1),
    )


async def test_budgets_are_restored_from_the_ledger(
    make_settings: Callable[..., TenancySettings],
) -> None:
    runtime = await build_runtime(make_settings())
    try:
        await upgrade(runtime.engine)
        async with runtime.sessionmaker() as session:
            await record_usage_batch(
                session,
                records=[
                    _row("a", "ka", NOW - dt.timedelta(hours=2), 100, 50),  # today
                    _row("a", "kb", NOW - dt.timedelta(hours=1), 10, 5),  # today, other key
                    _row("a", "ka", NOW - dt.timedelta(days=5), 1000, 0),  # this month
                    _row("a", "ka", NOW - dt.timedelta(days=40), 99999, 0),  # last month
                    _row("b", None, NOW - dt.timedelta(minutes=5), 7, 3),  # another tenant
                ],
            )
        store = InProcessQuotaStore(lease_ttl_s=30, clock=lambda: NOW.timestamp())
        runtime.quotas = store
        runtime.now = lambda: NOW
        assert await runtime.restore_budgets() == 3  # (a, ka), (a, kb), (b, None)
        a = await store.usage("t:a")
        assert (a.day_tokens, a.month_tokens) == (165, 1165)
        ka = await store.usage("k:ka")
        assert (ka.day_tokens, ka.month_tokens) == (150, 1150)
        b = await store.usage("t:b")
        assert (b.day_tokens, b.month_tokens) == (10, 10)
        # A daily budget of 200 has 35 left: a request reserving 36 is refused as exhausted.
        subject = QuotaSubject("t:a", QuotaLimits(daily_token_budget=200))
        await store.admit(request_id=RequestId("ok"), subjects=[subject], reserve_tokens=35)
        try:
            await store.admit(request_id=RequestId("no"), subjects=[subject], reserve_tokens=1)
        except QuotaExceeded as exc:
            assert exc.limit is Limit.DAILY and exc.code == "insufficient_quota"
        else:
            raise AssertionError("the restored daily budget was not enforced")
    finally:
        await runtime.close()


async def test_each_served_base_model_s_budgets_are_restored(
    make_settings: Callable[..., TenancySettings],
) -> None:
    """A request counts against its base model's policies too (t:<tenant>/m:<model>): after a
    restart those counters hold again what the ledger says each model was charged, an
    adapter's requests under its base model's."""
    settings = make_settings()
    runtime = await build_runtime(settings)
    try:
        await upgrade(runtime.engine)
        primary = runtime.adapters.primary_base_model
        runtime.adapters.serve_base_model(
            BaseModelSpec(name="small"), FormatChecksValidator(settings)
        )
        ids = {name: str(uuid.uuid4()) for name in ("small", "legacy", "gone")}
        async with runtime.sessionmaker() as session:
            for name, base in (("small", "small"), ("legacy", "an/old/path")):
                session.add(Adapter(
                    id=ids[name], owner_tenant_id=None, name=f"lora-{name}", base_model=base,
                    rank=4, alpha=8.0, target_modules=["q_proj"], sha256="0" * 64, size_bytes=1,
                ))  # fmt: skip
            await session.commit()
            today = NOW - dt.timedelta(hours=1)
            await record_usage_batch(
                session,
                records=[
                    _row("m", "km", today, 100, 0, model=primary),
                    _row("m", "km", today, 20, 5, model="lora-small", adapter_id=ids["small"]),
                    _row("m", "km", today, 7, 0, model="small"),
                    # recorded under a base model no longer served: it served on the primary
                    _row("m", "km", today, 3, 0, model="lora-legacy", adapter_id=ids["legacy"]),
                    # its adapter row deleted, or a model no longer served: every model only
                    _row("m", "km", today, 1, 0, model="lora-gone", adapter_id=ids["gone"]),
                    _row("m", None, today, 2, 0, model="retired"),
                ],
            )
        store = InProcessQuotaStore(lease_ttl_s=30, clock=lambda: NOW.timestamp())
        runtime.quotas = store
        runtime.now = lambda: NOW
        await runtime.restore_budgets()
        expected = {
            "t:m": 138, "k:km": 136,
            f"t:m/m:{primary}": 103, f"k:km/m:{primary}": 103,
            "t:m/m:small": 32, "k:km/m:small": 32,
            "t:m/m:retired": 0, "t:m/m:an/old/path": 0,
        }  # fmt: skip
        for subject, tokens in expected.items():
            usage = await store.usage(subject)
            assert (subject, usage.day_tokens, usage.month_tokens) == (subject, tokens, tokens)
    finally:
        await runtime.close()


@pytest.mark.redis
async def test_the_redis_store_keeps_its_own_counters(
    make_settings: Callable[..., TenancySettings], redis_url: str, redis_prefix: str
) -> None:
    settings = make_settings(
        quota_store="redis", redis_url=redis_url, redis_key_prefix=redis_prefix
    )
    runtime = await build_runtime(settings)
    try:
        # Not migrated: reading the ledger would fail, so 0 also proves nothing was read.
        assert await runtime.restore_budgets() == 0
    finally:
        await runtime.close()
