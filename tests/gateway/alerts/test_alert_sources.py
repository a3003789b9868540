"""Issue 45, item 3: the other sources of alerts, through the real gateway. A key's own currency
budget (issue 45, item 2: prices, micro-units) crosses its threshold and the key's alert names
it; the quota store and the engine failing reach a subscribed tenant once per outage (a tenant
not subscribed gets nothing), and the next outage, after recovery, alerts again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from gateway_harness import (
    ADMIN_CTX,
    Gateway,
    SecretScan,
    TenantKey,
    gateway_settings,
    running_gateway,
)
from sqlalchemy import select
from webhook_receiver import webhook_receiver

from gateway.errors import EngineFailed
from tenancy.alerts import signing
from tenancy.auth.scopes import Scope
from tenancy.crud.quotas import put_policy
from tenancy.errors import QuotaStoreUnavailable
from tenancy.schemas import QuotaLimitsIn
from tenancy.sql.models import ApiKey

ALERTS = {"allow_private_urls": True, "backoff_s": 0.1, "poll_interval_s": 0.1,
          "outage_min_interval_s": 0}  # fmt: skip
# One currency unit a token (1,000,000 micros), so a request's cost is its token count.
PRICES = {"tiny": {"prompt": "1000000", "completion": "1000000"}}


@pytest_asyncio.fixture
async def gw(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(tiny_model_dir, tmp_path, alerts=ALERTS, prices=PRICES)
    async with running_gateway(settings, secret_scan) as gateway:
        yield gateway


async def _chat(gw: Gateway, tenant: TenantKey) -> Any:
    body = gw.chat_body("hi", max_tokens=4)
    return await gw.client.post("/v1/chat/completions", json=body, headers=tenant.headers)


async def _webhook(gw: Gateway, admin: TenantKey, tenant_id: str, url: str, **fields: Any) -> str:
    r = await gw.client.post(
        f"/admin/v1/tenants/{tenant_id}/webhook", json={"url": url, **fields}, headers=admin.headers
    )
    assert r.status_code == 201, r.text
    return gw.scan.add(r.json()["secret"])


async def test_a_keys_currency_budget_alerts_with_the_key_named(gw: Gateway) -> None:
    admin = await gw.tenant(scopes=(Scope.ADMIN,))
    probe = await gw.tenant()
    r = await _chat(gw, probe)
    per_request = r.json()["usage"]["total_tokens"] * 1_000_000  # micros
    tenant = await gw.tenant()
    async with gw.state.tenancy.sessionmaker() as session:
        key_id = (
            await session.scalars(select(ApiKey.id).where(ApiKey.tenant_id == tenant.tenant_id))
        ).one()
        limits = QuotaLimitsIn(monthly_spend_budget_micros=2 * per_request)
        await put_policy(
            session, ctx=ADMIN_CTX, tenant_id=tenant.tenant_id, limits=limits, key_id=key_id
        )
    with webhook_receiver() as receiver:
        secret = await _webhook(gw, admin, tenant.tenant_id, receiver.url, thresholds=[50, 80])
        assert (await _chat(gw, tenant)).status_code == 200  # half the key's monthly budget
        [got] = await receiver.wait_for(1)
        await asyncio.sleep(0.3)
        assert len(receiver.received) == 1  # 80% is not reached
    assert signing.verify(
        secret, body=got.body, timestamp=got.headers[signing.TIMESTAMP_HEADER],
        header=got.headers[signing.SIGNATURE_HEADER],
    )  # fmt: skip
    event = got.event
    assert event["subject"] == f"k:{key_id}" and event["api_key_id"] == key_id
    assert event["budget"] == "monthly_spend_budget_micros" and event["unit"] == "micros"
    assert event["threshold"] == 50 and event["used"] == per_request
    assert event["limit"] == 2 * per_request and len(event["period"]) == 7  # 2026-11


async def test_outages_alert_subscribed_tenants_once_per_outage(gw: Gateway) -> None:
    admin = await gw.tenant(scopes=(Scope.ADMIN,))
    tenant = await gw.tenant()
    quiet = await gw.tenant()
    store, engine = gw.state.tenancy.quotas, gw.state.lifecycle.engine
    admit, open_ = store.admit, engine.open

    async def store_down(**kw: Any) -> Any:
        raise QuotaStoreUnavailable()

    async def engines_down(*a: Any, **kw: Any) -> Any:
        raise EngineFailed("No engine replica is available.", status_code=502)

    events = ["outage.quota_store", "outage.engine"]
    with webhook_receiver() as receiver, webhook_receiver() as quiet_receiver:
        await _webhook(gw, admin, tenant.tenant_id, receiver.url, events=events)
        await _webhook(gw, admin, quiet.tenant_id, quiet_receiver.url)  # budgets only
        store.admit = store_down  # type: ignore[method-assign]
        for _ in range(5):  # one outage, however many requests meet it
            assert (await _chat(gw, tenant)).status_code == 503
        [first] = await receiver.wait_for(1)
        assert first.event["type"] == "outage.quota_store"
        assert (
            first.event["service"] == "quota_store" and first.event["tenant_id"] == tenant.tenant_id
        )
        store.admit = admit  # type: ignore[method-assign]
        engine.open = engines_down  # type: ignore[method-assign]
        for _ in range(3):
            assert (await _chat(gw, tenant)).status_code == 502
        got = await receiver.wait_for(2)
        assert got[1].event["type"] == "outage.engine"
        engine.open = open_  # type: ignore[method-assign]
        assert (await _chat(gw, tenant)).status_code == 200  # both answer again
        await asyncio.sleep(0.3)
        assert len(receiver.received) == 2
        store.admit = store_down  # type: ignore[method-assign]
        assert (await _chat(gw, tenant)).status_code == 503  # a second outage: a second alert
        got = await receiver.wait_for(3)
        store.admit = admit  # type: ignore[method-assign]
        assert (
            got[2].event["type"] == "outage.quota_store" and got[2].event["id"] != first.event["id"]
        )
        await asyncio.sleep(0.3)
        assert len(receiver.received) == 3
        assert quiet_receiver.received == []  # not subscribed to outages
