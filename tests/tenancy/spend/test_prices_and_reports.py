"""Prices through the admin API (admin only, audited, exact or refused), the price a request pays
(adapter, else model, else settings, else free), spend reports scoped to the caller's tenant, and
currency budgets restored from the ledger's costs after an in-process restart."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from admin_harness import Harness, admin_harness

from tenancy.crud.usage import UsageIn, record_usage_batch
from tenancy.ids import ApiKeyId, RequestId, TenantId
from tenancy.quota.memory_store import InProcessQuotaStore
from tenancy.settings import TenancySettings
from tenancy.spend.money import Price
from tenancy.spend.prices import price_for
from tenancy.spend.schemas import PriceSpec
from tenancy.sql.models import Adapter

NOW = dt.datetime(2026, 11, 18, 15, 30, tzinfo=dt.UTC)


async def _tenant_admin(h: Harness) -> tuple[str, str]:
    r = await h.call("POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"})
    tenant_id = str(r.json()["id"])
    r = await h.call("POST", f"/tenants/{tenant_id}/keys",
                     json={"name": "ops", "scopes": ["tenant-admin"]})  # fmt: skip
    return tenant_id, str(r.json()["key"])


async def _adapter(h: Harness, tenant_id: str) -> str:
    async with h.runtime.sessionmaker() as session:
        adapter = Adapter(
            id=str(uuid.uuid4()), owner_tenant_id=tenant_id, name="lora", base_model="tiny",
            rank=4, alpha=8.0, target_modules=["q_proj"], sha256="0" * 64, size_bytes=1,
            storage_path="/nowhere",
        )  # fmt: skip
        session.add(adapter)
        await session.commit()
        return adapter.id


async def test_prices_are_admin_only_audited_and_exact(h: Harness) -> None:
    _, ops = await _tenant_admin(h)
    body: dict[str, Any] = {"model": "tiny", "prompt": "0.15", "completion": 0.6}
    assert (await h.call("PUT", "/prices", ops, json=body)).status_code == 403
    assert (await h.call("GET", "/prices", ops)).status_code == 403
    r = await h.call("PUT", "/prices", json={**body, "prompt": "0.1500001"})
    assert r.status_code == 400 and "prompt" in r.text and "6 decimal places" in r.text
    r = await h.call("PUT", "/prices", json={**body, "adapter_id": str(uuid.uuid4())})
    assert r.status_code == 404
    r = await h.call("PUT", "/prices", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["prompt"], out["cached"], out["completion"]) == ("0.150000", "0.150000", "0.600000")
    assert out["completion_micros_per_mtok"] == 600_000 and out["currency"] == "USD"
    r = await h.call("PUT", "/prices", json={**body, "cached": "0.075"})  # replaces the row
    assert [p["cached"] for p in (await h.call("GET", "/prices")).json()] == ["0.075000"]
    events = (await h.call("GET", "/audit", params={"action": "price.put"})).json()
    assert len(events) == 2 and events[0]["after"]["cached_micros_per_mtok"] == 75_000
    assert events[0]["before"]["cached_micros_per_mtok"] == 150_000


async def test_the_price_a_request_pays(make_settings: Callable[..., TenancySettings]) -> None:
    defaults = {"tiny": PriceSpec(prompt=Decimal(1), completion=Decimal(2))}
    async with admin_harness(make_settings(prices=defaults)) as h:
        tenant_id, _ = await _tenant_admin(h)
        adapter_id = await _adapter(h, tenant_id)

        async def paid(adapter: str | None) -> Price:
            async with h.runtime.sessionmaker() as session:
                return await price_for(session, model="tiny", adapter_id=adapter,
                                       defaults=h.runtime.settings.prices)  # fmt: skip

        assert await paid(None) == await paid(adapter_id) == Price(10**6, 10**6, 2 * 10**6)
        listed = (await h.call("GET", "/prices")).json()
        assert [(p["model"], p["source"]) for p in listed] == [("tiny", "settings")]
        await h.call("PUT", "/prices", json={"model": "tiny", "prompt": 3, "completion": 4})
        assert await paid(adapter_id) == Price(3 * 10**6, 3 * 10**6, 4 * 10**6)  # the model's row
        r = await h.call("PUT", "/prices", json={"model": "tiny", "adapter_id": adapter_id,
                                                 "prompt": 5, "cached": 1, "completion": 6})  # fmt: skip
        assert r.status_code == 200, r.text
        assert await paid(adapter_id) == Price(5 * 10**6, 10**6, 6 * 10**6)
        assert await paid(None) == Price(3 * 10**6, 3 * 10**6, 4 * 10**6)
        async with h.runtime.sessionmaker() as session:
            assert await price_for(session, model="other", adapter_id=None, defaults={}) == Price()
        assert [p["source"] for p in (await h.call("GET", "/prices")).json()] == ["database"] * 2


def _row(tenant: str, key: str, started: dt.datetime, cost: int, model: str = "tiny") -> UsageIn:
    return UsageIn(
        request_id=RequestId(uuid.uuid4().hex), tenant_id=TenantId(tenant),
        api_key_id=ApiKeyId(key), model=model, adapter_id=None, prompt_tokens=10,
        completion_tokens=5, cached_tokens=0, finish_reason="length", started_at=started,
        finished_at=started + dt.timedelta(seconds=1), cost_micros=cost,
    )  # fmt: skip


async def test_spend_reports_are_scoped_to_the_callers_tenant(h: Harness) -> None:
    a, ops_a = await _tenant_admin(h)
    b, _ = await _tenant_admin(h)
    now = dt.datetime.now(dt.UTC)
    async with h.runtime.sessionmaker() as session:
        await record_usage_batch(session, records=[
            _row(a, "ka", now, 1_500_000), _row(a, "kb", now, 250, model="lora"),
            _row(b, "kc", now, 7),
        ])  # fmt: skip
    r = await h.call("GET", f"/tenants/{a}/spend", ops_a)
    assert r.status_code == 200
    report = r.json()
    assert (report["total"]["cost_micros"], report["total"]["cost"]) == (1_500_250, "1.500250")
    assert [(k["api_key_id"], k["cost"]) for k in report["by_key"]] == [
        ("ka", "1.500000"), ("kb", "0.000250")]  # fmt: skip
    assert [m["model"] for m in report["by_model"]] == ["tiny", "lora"]
    assert (await h.call("GET", f"/tenants/{b}/spend", ops_a)).status_code == 404
    assert [t["tenant_id"] for t in (await h.call("GET", "/spend", ops_a)).json()] == [a]
    every = {t["tenant_id"]: t["cost_micros"] for t in (await h.call("GET", "/spend")).json()}
    assert (every[a], every[b]) == (1_500_250, 7)
    yesterday = (now - dt.timedelta(days=1)).date().isoformat()
    r = await h.call("GET", f"/tenants/{a}/spend", params={"until": yesterday})
    assert r.json()["total"]["cost_micros"] == 0


async def test_spend_budgets_are_restored_from_the_ledger(h: Harness) -> None:
    async with h.runtime.sessionmaker() as session:
        await record_usage_batch(session, records=[
            _row("a", "ka", NOW - dt.timedelta(hours=2), 1_000),  # today
            _row("a", "kb", NOW - dt.timedelta(days=3), 20_000),  # this month
            _row("a", "ka", NOW - dt.timedelta(days=40), 999_999),  # last month
        ])  # fmt: skip
    store = InProcessQuotaStore(lease_ttl_s=30, clock=lambda: NOW.timestamp())
    h.runtime.quotas = store
    h.runtime.now = lambda: NOW
    await h.runtime.restore_budgets()
    tenant = await store.usage("t:a")
    assert (tenant.day_spend_micros, tenant.month_spend_micros) == (1_000, 21_000)
    key = await store.usage("k:kb")
    assert (key.day_spend_micros, key.month_spend_micros) == (0, 20_000)
