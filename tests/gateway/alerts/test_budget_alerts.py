"""Issue 45, item 3 (budget alerts), acceptance: real requests through a real gateway (tiny
model, in-process quota store, SQLite) cross 50, 80 and 100% of a tenant's daily token budget;
a real HTTP receiver on a loopback port gets each threshold's webhook exactly once, with a
signature the test verifies with the secret the admin API returned once; a receiver that fails
twice (500) then succeeds gets the alert on the third attempt, and the delivery log in the admin
API shows the three attempts with their statuses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from gateway_harness import Gateway, SecretScan, TenantKey, gateway_settings, running_gateway
from webhook_receiver import Received, webhook_receiver

from tenancy.alerts import signing
from tenancy.auth.scopes import Scope

MAX_TOKENS = 4
ALERTS = {"allow_private_urls": True, "backoff_s": 0.2, "poll_interval_s": 0.1}


@pytest_asyncio.fixture
async def gw(
    tiny_model_dir: Path, tmp_path: Path, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(tiny_model_dir, tmp_path, alerts=ALERTS)
    async with running_gateway(settings, secret_scan) as gateway:
        yield gateway


async def _chat(gw: Gateway, tenant: TenantKey) -> tuple[int, int]:
    """One request; (status, total tokens charged)."""
    body = gw.chat_body("hi", max_tokens=MAX_TOKENS)
    r = await gw.client.post("/v1/chat/completions", json=body, headers=tenant.headers)
    return r.status_code, r.json()["usage"]["total_tokens"] if r.status_code == 200 else 0


async def _webhook(
    gw: Gateway, admin: TenantKey, tenant: TenantKey, url: str, **fields: Any
) -> str:
    r = await gw.client.post(
        f"/admin/v1/tenants/{tenant.tenant_id}/webhook",
        json={"url": url, **fields},
        headers=admin.headers,
    )
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"
    secret: str = r.json()["secret"]
    gw.scan.add(secret)  # never in a log line
    return secret


def _verified(secret: str, received: Received) -> bool:
    return signing.verify(
        secret,
        body=received.body,
        timestamp=received.headers[signing.TIMESTAMP_HEADER],
        header=received.headers[signing.SIGNATURE_HEADER],
    )


async def _settle(gw: Gateway) -> None:
    """Let the alert task and the sender finish what the last request started."""
    alerts = gw.state.alerts
    assert alerts is not None
    for _ in range(3):
        await asyncio.sleep(0.05)
        await alerts.budgets.run_once()
        await alerts.worker.run_once()


async def test_each_threshold_is_delivered_once_signed(gw: Gateway) -> None:
    admin = await gw.tenant(scopes=(Scope.ADMIN,))
    probe = await gw.tenant()
    status, per_request = await _chat(gw, probe)  # the same request always charges the same
    assert status == 200 and per_request > MAX_TOKENS
    # 50% after 5 requests, 80% after 8; the 10th would land exactly on the budget, but its
    # reservation (prompt + max_tokens) is above what it is charged, so it is refused: 100%.
    budget = 10 * per_request
    tenant = await gw.tenant(daily_token_budget=budget)
    with webhook_receiver() as receiver:
        secret = await _webhook(gw, admin, tenant, receiver.url)
        used, is_refused = 0, False
        for _ in range(12):  # past the budget, refusals send nothing more
            status, charged = await _chat(gw, tenant)
            used += charged
            is_refused = is_refused or status == 429
            await _settle(gw)
            expected = [t for t in (50, 80) if used * 100 >= budget * t]
            expected += [100] if is_refused or used >= budget else []
            await receiver.wait_for(len(expected))  # a duplicate shows by the next request
            assert [r.event["threshold"] for r in receiver.received] == expected, used
        assert is_refused and used == 9 * per_request
        await _settle(gw)
        await asyncio.sleep(0.3)
        got = list(receiver.received)
    assert [r.event["threshold"] for r in got] == [50, 80, 100]
    for received in got:
        assert _verified(secret, received)
        assert not _verified("whsec_" + "x" * 43, received)  # another secret: refused
        event = received.event
        assert event["type"] == "budget.threshold"
        assert event["tenant_id"] == tenant.tenant_id
        assert event["subject"] == f"t:{tenant.tenant_id}" and event["api_key_id"] is None
        assert event["budget"] == "daily_token_budget" and event["unit"] == "tokens"
        assert event["limit"] == budget
        if event["threshold"] < 100:
            assert event["used"] * 100 >= budget * event["threshold"]
            assert event["exhausted"] is False
        else:  # refused for the budget: exhausted, with what was charged
            assert event["exhausted"] is True and event["used"] == used
        assert len(event["period"]) == 10  # the UTC day, 2026-11-29
        assert received.headers[signing.EVENT_ID_HEADER] == event["id"]
        assert received.headers[signing.ATTEMPT_HEADER] == "1"
    # the delivery log agrees: three delivered, one attempt each, answered 200
    r = await gw.client.get(
        f"/admin/v1/tenants/{tenant.tenant_id}/webhook/deliveries", headers=admin.headers
    )
    assert r.status_code == 200, r.text
    log = r.json()
    assert sorted(d["payload"]["threshold"] for d in log) == [50, 80, 100]
    assert {d["status"] for d in log} == {"delivered"}
    assert [[a["status_code"] for a in d["attempts"]] for d in log] == [[200]] * 3


async def test_a_failing_receiver_gets_it_on_the_third_attempt(gw: Gateway) -> None:
    admin = await gw.tenant(scopes=(Scope.ADMIN,))
    probe = await gw.tenant()
    _, per_request = await _chat(gw, probe)
    tenant = await gw.tenant(daily_token_budget=2 * per_request)  # one request: 50%
    with webhook_receiver(statuses=[500, 500]) as receiver:
        secret = await _webhook(gw, admin, tenant, receiver.url, thresholds=[50])
        status, _ = await _chat(gw, tenant)
        assert status == 200
        got = await receiver.wait_for(3)  # the worker's own loop retries, with its backoff
        await asyncio.sleep(0.3)
        assert len(receiver.received) == 3  # delivered: no fourth attempt
    assert [r.answered for r in got] == [500, 500, 200]
    assert [r.headers[signing.ATTEMPT_HEADER] for r in got] == ["1", "2", "3"]
    assert len({r.event["id"] for r in got}) == 1  # one event, retried
    assert all(_verified(secret, r) for r in got)  # each attempt signed afresh
    # exponential backoff: 0.2 s, then 0.4 s (within the worker's polling)
    assert got[1].at - got[0].at >= 0.2
    assert got[2].at - got[1].at >= 0.4
    r = await gw.client.get(
        f"/admin/v1/tenants/{tenant.tenant_id}/webhook/deliveries", headers=admin.headers
    )
    assert r.status_code == 200, r.text
    [delivery] = r.json()
    assert delivery["status"] == "delivered" and delivery["num_attempts"] == 3
    assert delivery["last_status_code"] == 200 and delivery["next_attempt_at"] is None
    attempts = delivery["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["status_code"] for a in attempts] == [500, 500, 200]
    assert [a["error"] for a in attempts] == ["HTTP 500", "HTTP 500", None]
    assert all(a["finished_at"] >= a["started_at"] for a in attempts)
    assert delivery["payload"]["threshold"] == 50
